// App Service authentication (Easy Auth, V2 settings) in front of the Function app: the operator API takes
// Entra ID access tokens for the operator API's app registration and nothing else. No login flow and no
// client secret: the app only validates bearer tokens, and a caller without one gets 401, never a redirect.
// Two paths are excluded, each still guarded by a function key: the health probe and the automation route
// (named keys, docs/functions.md). Roles (Operator, Reader) are checked by central from the principal.
@description('Function app name.')
param functionAppName string

@description('Application (client) id of the operator API app registration (infra/hooks/operator-app.sh creates it, or give your own).')
@minLength(36)
param operatorApiClientId string

@description('Paths App Service authentication lets through without a token (each still needs a function key).')
param excludedPaths array

resource site 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

resource auth 'Microsoft.Web/sites/config@2024-04-01' = {
  parent: site
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: true
      unauthenticatedClientAction: 'Return401'
      excludedPaths: excludedPaths
    }
    httpSettings: {
      requireHttps: true
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: operatorApiClientId
          // This issuer accepts the tenant's v1 and v2 access tokens (az account get-access-token issues v1).
          openIdIssuer: 'https://sts.windows.net/${tenant().tenantId}/v2.0'
        }
        validation: {
          allowedAudiences: [
            'api://${operatorApiClientId}'
            operatorApiClientId
          ]
        }
      }
    }
    login: {
      tokenStore: {
        enabled: false
      }
    }
  }
}

output excludedPaths array = auth.properties.globalValidation.excludedPaths
