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
  // This resource is the 'authsettingsV2' config, not the 'web' site config. checkov applies its site-config checks to every
  // sites/config resource; none of these properties can exist on an authsettingsV2 resource:
  // checkov:skip=CKV_AZURE_66: site-config check (failed request tracing) misapplied to the authentication settings.
  // checkov:skip=CKV_AZURE_63: site-config check (HTTP logging) misapplied to the authentication settings; logs go to Application Insights.
  // checkov:skip=CKV_AZURE_222: site-config check (public network access) misapplied; see the site's own skip in function.bicep.
  // checkov:skip=CKV_AZURE_80: .NET Framework version check misapplied; the app runs Python 3.11.
  // checkov:skip=CKV_AZURE_13: it reads App Service Authentication from the site's siteConfig; this resource is that authentication (platform.enabled, Return401).
  // checkov:skip=CKV_AZURE_88: Azure Files check misapplied; Flex Consumption uses no Azure Files content share.
  // checkov:skip=CKV_AZURE_65: site-config check (detailed error messages) misapplied to the authentication settings.
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
