// The Function app on Flex Consumption (Linux, Python 3.11), running as its user-assigned identity:
// identity-based connections to Event Hubs, Storage queues/tables and host storage; the deployment
// package read from a blob container with the same identity; no keys or connection strings anywhere.
@description('Azure region.')
param location string

@description('Tags put on every resource.')
param tags object

@description('Tags only on the site (azd finds the service by azd-service-name).')
param siteTags object

@description('Flex Consumption plan name.')
param planName string

@description('Function app name.')
param functionAppName string

@description('Resource id of the Function app user-assigned identity.')
param identityId string

@description('Client id of the Function app user-assigned identity.')
param identityClientId string

@description('Storage account name (host storage, queues, tables).')
param storageAccountName string

@description('URL of the deployment blob container.')
param deploymentContainerUrl string

@description('Fully qualified Event Hubs namespace (name.servicebus.windows.net).')
param eventHubsFullyQualifiedNamespace string

@description('Event Hub name.')
param eventHubName string

@description('Event Hub the platform feed (Event Grid scheduled events) is delivered to.')
param platformEventHubName string

@description('ARM id prefixes of VMs opted in to the platform feed (comma-separated); empty: none.')
param platformConfirmScopes string = ''


@description('Consumer group the Functions read with.')
param consumerGroupName string

@description('Application Insights connection string.')
param appInsightsConnectionString string

@description('The central policy JSON (schemas/policy.schema.json); empty: the built-in defaults.')
param policyJson string

@description('A shadow policy (never acts; its verdicts are recorded beside the live ones); empty: none.')
param policyShadowJson string

@description('Key Vault secret URI of the webhook URL; empty: alerts only logged.')
param webhookSecretUri string

@description('generic, teams or slack.')
@allowed([
  'generic'
  'teams'
  'slack'
])
param alertWebhookFormat string

@allowed([
  'info'
  'warning'
  'critical'
])
@description('An event\'s status alerts under this severity are not posted (other kinds always are).')
param statusAlertMinSeverity string

@description('Prefix of the log store table names.')
param tablePrefix string

@description('NCRONTAB schedule of the re-evaluation timer.')
param reevaluateSchedule string

@description('Seconds the elected leader VM has to report an approval result before central fails over.')
@minValue(10)
param approvalResultTimeoutSeconds int

@description('Seconds the leader VM has for a hook-then-approve attempt before central fails over.')
@minValue(10)
param approvalHookResultTimeoutSeconds int

@description('api-version of the Microsoft.Maintenance scheduledevents acknowledge calls.')
param armApiVersion string

@description('Minutes without a heartbeat after which the heartbeats-missing alert fires: central logs each VM\'s heartbeat marker twice per window.')
@minValue(5)
@maxValue(1440)
param heartbeatMissingMinutes int

@description('A forwarder counts as live if central heard from it within this many seconds.')
@minValue(30)
param leaderLivenessSeconds int

@description('Webhook attempts per alert.')
@minValue(1)
@maxValue(10)
param alertMaxAttempts int

@description('Backoff base between webhook attempts in seconds (a decimal, as text: Bicep has no floats).')
param alertBackoffSeconds string

@description('Per-request webhook timeout in seconds.')
@minValue(1)
@maxValue(60)
param alertTimeoutSeconds int

@description('Sender authentication mode: required | preferred | off (docs/security.md).')
param authnMode string

@description('Sender authentication: PEM certificates added to the shipped trust (docs/security.md); empty: none.')
param authnTrustPem string

@description('Sender authentication: days a trust-refused envelope is kept for re-verification (AUTHN_HELD_DAYS).')
param authnHeldDays int

@description('Sender authentication: comma-separated DNS domains the signer certificate must be under.')
param authnMetadataDomains string

@description('Application (client) id of the operator API app registration: central validates operators\' tokens for it.')
param operatorApiClientId string

@description('Named function keys that may decide on the automation route: JSON {"<key name>": "<sha256 hex>"}; empty: none.')
param operatorKeySha256 string

@description('Most instances the app scales out to.')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int

@description('Memory of each instance (MB).')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int

// The one list of the app's own setting names is central/app_settings.json (function_app.py reads the
// same file). This object gives each name its value from the resources; tests/infra checks that its keys
// are exactly that list, both ways. (No items()/objectKeys() loop here: checkov's Bicep parser cannot
// read those functions, and a file it cannot parse would go unscanned.)
var settingsDoc = loadJsonContent('../../central/app_settings.json')

var appSettingValues = {
  EVENTHUB_NAME: eventHubName
  EVENTHUB_CONSUMER_GROUP: consumerGroupName
  PLATFORM_EVENTHUB_NAME: platformEventHubName
  ARM_ENDPOINT: environment().resourceManager
  ARM_API_VERSION: armApiVersion
  REPORT_GRACE_SECONDS: '120'
  CLAIMS_COUNTED_PER_HOUR: '4'
  PLATFORM_CONFIRM_SCOPES: platformConfirmScopes
  PLATFORM_CONFIRM_GRACE_SECONDS: '300'
  HEARTBEAT_MISSING_MINUTES: string(heartbeatMissingMinutes)
  EventHubConnection__fullyQualifiedNamespace: eventHubsFullyQualifiedNamespace
  EventHubConnection__credential: 'managedidentity'
  EventHubConnection__clientId: identityClientId
  ApprovalStorage__queueServiceUri: 'https://${storageAccountName}.queue.${environment().suffixes.storage}'
  ApprovalStorage__tableServiceUri: 'https://${storageAccountName}.table.${environment().suffixes.storage}'
  ApprovalStorage__credential: 'managedidentity'
  ApprovalStorage__clientId: identityClientId
  POLICY_JSON: policyJson
  POLICY_SHADOW_JSON: policyShadowJson
  ALERT_WEBHOOK_URL: empty(webhookSecretUri) ? '' : '@Microsoft.KeyVault(SecretUri=${webhookSecretUri})'
  ALERT_WEBHOOK_FORMAT: alertWebhookFormat
  STATUS_ALERT_MIN_SEVERITY: statusAlertMinSeverity
  TABLE_PREFIX: tablePrefix
  REEVALUATE_SCHEDULE: reevaluateSchedule
  APPROVAL_RESULT_TIMEOUT_SECONDS: string(approvalResultTimeoutSeconds)
  APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS: string(approvalHookResultTimeoutSeconds)
  LEADER_LIVENESS_SECONDS: string(leaderLivenessSeconds)
  ALERT_MAX_ATTEMPTS: string(alertMaxAttempts)
  ALERT_BACKOFF_SECONDS: alertBackoffSeconds
  ALERT_TIMEOUT_SECONDS: string(alertTimeoutSeconds)
  AUTHN_MODE: authnMode
  AUTHN_TRUST_PEM: authnTrustPem
  AUTHN_HELD_DAYS: string(authnHeldDays)
  AUTHN_METADATA_DOMAINS: authnMetadataDomains
  OPERATOR_API_AUDIENCE: 'api://${operatorApiClientId}'
  OPERATOR_API_ISSUERS: 'https://sts.windows.net/${tenant().tenantId}/,${loginEndpoint}${tenant().tenantId}/v2.0'
  OPERATOR_API_JWKS_URL: '${loginEndpoint}${tenant().tenantId}/discovery/v2.0/keys'
  OPERATOR_KEY_SHA256: operatorKeySha256
  OPERATOR_CONSOLE_AUTHORITY: '${loginEndpoint}${tenant().tenantId}'
  APP_PUBLIC_URL: 'https://${site.properties.defaultHostName}'
  AUTHN_AIA_HOSTS: ''
}

// The Entra ID authority of this cloud (login.microsoftonline.com in Azure public).
var loginEndpoint = environment().authentication.loginEndpoint

// Same key set <=> the union adds no key and both have the same count.
var appSettingNamesMatch = length(union(settingsDoc.settings, appSettingValues)) == length(settingsDoc.settings) && length(appSettingValues) == length(settingsDoc.settings)

// What the Functions host itself needs (not the app's code): host storage over the identity, and
// Application Insights with Entra (AAD) auth because the component has local auth disabled.
var hostSettingValues = {
  AzureWebJobsStorage__accountName: storageAccountName
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  APPLICATIONINSIGHTS_CONNECTION_STRING: appInsightsConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identityClientId};Authorization=AAD'
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  // checkov:skip=CKV_AZURE_225: Flex Consumption zone redundancy exists only in some regions and needs zone-redundant storage; the central app is stateless (state lives in Storage and the hub's checkpoints), so a zone outage delays processing, it loses nothing.
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
  }
}

resource site 'Microsoft.Web/sites@2024-04-01' = {
  // checkov:skip=CKV_AZURE_222: operators call the HTTP routes (pending events, approve/hold, health) from outside, signed in with Entra ID (auth.bicep); integrations and probes use named function keys. Add access restrictions or a private endpoint to narrow it further. The Event Hubs and timer triggers need no inbound access.
  // checkov:skip=CKV_AZURE_17: mutual TLS would lock out the operators' HTTP callers (Entra ID tokens, named keys); no trigger of this app is reached over inbound HTTPS except those routes.
  // checkov:skip=CKV_AZURE_212: a Flex Consumption app has no fixed instance count: the scale controller adds instances per Event Hubs partition load, and processing resumes from the checkpoint after an instance fails.
  // checkov:skip=CKV_AZURE_213: Flex Consumption has no load-balancer health-check eviction to configure; the app exposes GET /api/health for external probes, and the alert rules in alerts.bicep watch failures.
  name: functionAppName
  location: location
  tags: siteTags
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    clientCertMode: 'Optional'
    // Key Vault references resolve with the user-assigned identity, not a system one.
    keyVaultReferenceIdentity: identityId
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: deploymentContainerUrl
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
  }
}

// All app settings in one PUT (it replaces the whole set: nothing stale survives a redeploy).
resource appSettings 'Microsoft.Web/sites/config@2024-04-01' = {
  // This resource is the 'appsettings' name/value map, not the 'web' site config. checkov applies its site-config checks to every
  // sites/config resource; none of these properties can exist on an appsettings resource:
  // checkov:skip=CKV_AZURE_66: site-config check (failed request tracing) misapplied to the appsettings map.
  // checkov:skip=CKV_AZURE_63: site-config check (HTTP logging) misapplied to the appsettings map; logs go to Application Insights.
  // checkov:skip=CKV_AZURE_222: site-config check (public network access) misapplied to the appsettings map; see the site's own skip.
  // checkov:skip=CKV_AZURE_80: .NET Framework version check misapplied; the app runs Python 3.11.
  // checkov:skip=CKV_AZURE_13: site-config check (App Service Authentication) misapplied to the appsettings map; authentication is the authsettingsV2 resource in auth.bicep.
  // checkov:skip=CKV_AZURE_88: Azure Files check misapplied; Flex Consumption uses no Azure Files content share.
  // checkov:skip=CKV_AZURE_65: site-config check (detailed error messages) misapplied to the appsettings map.
  parent: site
  name: 'appsettings'
  properties: union(hostSettingValues, appSettingValues)
}

// Basic-auth publishing (FTP and SCM) off: deployments go through Entra ID only.
resource ftpPolicy 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmPolicy 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'scm'
  properties: {
    allow: false
  }
}

output functionAppId string = site.id
output functionAppName string = site.name
output defaultHostName string = site.properties.defaultHostName
output appSettingNamesMatch bool = appSettingNamesMatch
