// The whole pipeline in one deployment: a resource group and, in it, Event Hubs, Storage, the Function
// app on Flex Consumption, Key Vault, monitoring, alerts and every role assignment.
// Deploy: `az deployment sub create -l <region> -f infra/main.bicep -p infra/main.bicepparam` or `azd up`.
targetScope = 'subscription'

@minLength(1)
@maxLength(40)
@description('Environment name (azd sets it); part of every resource name. At most 40 characters, so azd\'s deployment name <env>-<unix time> stays within ARM\'s 64.')
param environmentName string

// The regions that offer Flex Consumption (the Function app's plan): any other region is refused here,
// before anything is created. Keep this list and the keys of zoneRedundantByRegion below equal
// (tests/infra/test_regions.py). Source and date beside the table.
@minLength(1)
@allowed([
  'australiaeast'
  'australiasoutheast'
  'brazilsouth'
  'canadacentral'
  'centralindia'
  'centralus'
  'eastasia'
  'eastus'
  'eastus2'
  'eastus2euap'
  'francecentral'
  'germanywestcentral'
  'italynorth'
  'japaneast'
  'koreacentral'
  'northcentralus'
  'northeurope'
  'norwayeast'
  'southafricanorth'
  'southcentralus'
  'southeastasia'
  'southindia'
  'spaincentral'
  'swedencentral'
  'uaenorth'
  'uksouth'
  'ukwest'
  'westcentralus'
  'westeurope'
  'westus'
  'westus2'
  'westus3'
])
@metadata({
  azd: {
    type: 'location'
  }
})
@description('Azure region of every resource: one that offers Flex Consumption (`az functionapp list-flexconsumption-locations`).')
param location string

@maxLength(90)
@description('Resource group name; empty: rg-<environmentName>.')
param resourceGroupName string = ''

@description('Tags put on every resource.')
param tags object = {}

@description('Event Hub name the forwarders publish to.')
param eventHubName string = 'scheduled-events'

@minValue(1)
@maxValue(32)
@description('Partitions of the hub. One VM always maps to one partition (key = vmId).')
param eventHubPartitionCount int = 4

@minValue(1)
@maxValue(7)
@description('Days events stay in the hub.')
param eventHubRetentionDays int = 7

@minValue(1)
@maxValue(40)
@description('Throughput units of the Standard namespace.')
param eventHubCapacity int = 1

@allowed([
  'Enabled'
  'Disabled'
  'SecuredByPerimeter'
])
@description('Public network access of the Event Hubs namespace (Disabled needs private endpoints you add).')
param eventHubsPublicNetworkAccess string = 'Enabled'

@description('Consumer group the central Functions read with.')
param functionsConsumerGroupName string = 'central-functions'

@description('Consumer group for downstream analytics.')
param analyticsConsumerGroupName string = 'analytics'

@description('Capture every event to blob storage (Avro) for analytics.')
param captureEnabled bool = false

@minValue(60)
@maxValue(900)
@description('Seconds between Capture files.')
param captureIntervalInSeconds int = 300

@allowed([
  'Enabled'
  'Disabled'
])
@description('Public network access of the storage account.')
param storagePublicNetworkAccess string = 'Enabled'

@allowed([
  ''
  'Standard_LRS'
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
])
@description('Storage redundancy; empty: by region (Standard_ZRS where the region has zone-redundant storage, else Standard_LRS).')
param storageSkuName string = ''

@allowed([
  'Enabled'
  'Disabled'
])
@description('Public network access of Key Vault (the app resolves the webhook reference over it).')
param keyVaultPublicNetworkAccess string = 'Enabled'

@description('The central policy JSON (schemas/policy.schema.json); empty: the built-in defaults.')
param policyJson string = ''

@description('Entra object ids (users or groups) of operators who may read the log store (Storage Table Data Reader).')
param operatorPrincipalIds array = []

@description('Application (client) id of the operator API app registration: App Service authentication accepts tokens for it (infra/hooks/operator-app.sh creates it and assigns its Operator and Reader app roles).')
@minLength(36)
param operatorApiClientId string

@description('Named function keys of integrations allowed to decide on the automation route: a JSON object {"<key name>": "<SHA-256 hex of the key>"} (docs/functions.md); empty: none.')
param operatorKeySha256 string = ''

@description('Entra object ids (users or groups) of analysts: Storage Blob Data Reader on the Capture container (when Capture is on) and Azure Event Hubs Data Receiver on the hub.')
param analystPrincipalIds array = []

@description('A shadow policy evaluated beside the live one, never acting (docs/central.md); empty: none.')
param policyShadowJson string = ''

@secure()
@description('Alert webhook URL, stored in Key Vault; empty: alerts are only logged.')
param alertWebhookUrl string = ''

@allowed([
  'generic'
  'teams'
  'slack'
])
@description('Format of the alert webhook body.')
param alertWebhookFormat string = 'generic'

@allowed([
  'info'
  'warning'
  'critical'
])
@description('An event\'s status alerts under this severity are not posted (its end, or a start that was approved, is info; other kinds of alerts are always posted; docs/central.md).')
param statusAlertMinSeverity string = 'warning'

@description('Prefix of the log store table names.')
param tablePrefix string = 'scheduledevents'

@description('Sender authentication (docs/security.md): required (default: every envelope signed by its VM) | preferred (mid-rollout: unsigned accepted only from VMs never seen signed) | off (not recommended: anyone with the hub send right speaks for any VM).')
@allowed([
  'required'
  'preferred'
  'off'
])
param authnMode string = 'required'

@description('Sender authentication: PEM certificates ADDED to the shipped trust (DigiCert Global Root G2 and Microsoft RSA Root CA 2017 from certifi, Microsoft intermediates, AIA). Empty is right for the public cloud and Azure Government; 21Vianet: DigiCert Global Root CA.')
param authnTrustPem string = ''

@description('Sender authentication: days an envelope refused for a trust failure is kept for re-verification; past it, it is given up, counted in health and named in a critical alert.')
@minValue(1)
@maxValue(365)
param authnHeldDays int = 7

@description('Sender authentication: DNS domain(s) the attested document signer must be under; default: the deployment cloud\'s.')
param authnMetadataDomains string = environment().name == 'AzureUSGovernment' ? 'metadata.azure.us' : (environment().name == 'AzureChinaCloud' ? 'metadata.azure.cn' : 'metadata.azure.com')

@description('NCRONTAB schedule of the timer that re-evaluates held events.')
param reevaluateSchedule string = '0 */1 * * * *'

@minValue(10)
@description('Seconds the elected leader VM has to report an approval result before central fails over to another.')
param approvalResultTimeoutSeconds int = 120

@minValue(10)
@description('Seconds the leader VM has for a hook-then-approve attempt (its pre-approve hook, e.g. a drain, runs first) before central fails over: the forwarder\'s hook_timeout (300) plus a minute. Raise both together.')
param approvalHookResultTimeoutSeconds int = 360

@description('api-version of the Microsoft.Maintenance scheduledevents acknowledge calls (the ARM approval path): 2025-11-01 is the stable one; 2025-10-01-preview for a region that lags. A parameter, so that a switch survives the next deployment.')
param armApiVersion string = '2025-11-01'

@minValue(30)
@description('A forwarder counts as live (can be elected leader) if central heard from it within this many seconds.')
param leaderLivenessSeconds int = 300

@minValue(1)
@maxValue(10)
@description('Webhook attempts per alert.')
param alertMaxAttempts int = 3

@description('Backoff base between webhook attempts, seconds (decimal as text), doubled each retry.')
param alertBackoffSeconds string = '0.5'

@minValue(1)
@maxValue(60)
@description('Per-request webhook timeout, seconds.')
param alertTimeoutSeconds int = 5

@minValue(1)
@maxValue(1000)
@description('Most Flex Consumption instances.')
param functionMaximumInstanceCount int = 40

@allowed([
  512
  2048
  4096
])
@description('Memory of each Flex Consumption instance (MB).')
param functionInstanceMemoryMB int = 2048

@minValue(30)
@maxValue(730)
@description('Days Log Analytics keeps data.')
param logRetentionInDays int = 30

@description('Email address that receives the pipeline health alerts.')
param alertEmailAddress string

@minValue(5)
@maxValue(1440)
@description('Minutes without a heartbeat after which a forwarder alert fires.')
param heartbeatMissingMinutes int = 15

@description('Log marker of a processed heartbeat (contract with the central package).')
param heartbeatLogMarker string = 'se.heartbeat'

@description('Log marker of a heartbeat that reports outbox drops (contract with the central package).')
param outboxDropLogMarker string = 'se.outbox_dropped'

@maxLength(3)
@description('Appended to the Key Vault name. Empty normally; set it to take a new vault name instead of recovering a soft-deleted one (docs/deploy.md, "Provision again").')
param keyVaultNameSuffix string = ''

@description('The platform\'s own Scheduled Events feed (issue 23; docs/deploy.md, "The platform feed"): the subscription\'s Event Grid system topic (Microsoft.ResourceNotifications.MaintenanceResources) delivers to the platform hub. Off by default while Azure calls the feed PREVIEW (not recommended for production workloads); on needs the two feature registrations and, for whoever deploys, Azure Resource Notifications System Topics Subscriber.')
param platformFeedEnabled bool = false

@description('Platform feed: name of the subscription\'s existing MaintenanceResources system topic (Azure allows one per subscription); only this pipeline\'s event subscription is added to it. Empty: the deployment creates the topic.')
param platformSystemTopicName string = ''

@maxLength(90)
@description('Platform feed: resource group of that existing topic; empty: the pipeline\'s.')
param platformSystemTopicResourceGroup string = ''

@description('Platform feed: comma-separated ARM id prefixes (/subscriptions/<id>[/resourceGroups/<rg>]) of the VMs opted in (install-on-vms.sh --platform-feed): their events the platform has not emitted in time count toward no budget (PLATFORM_CONFIRM_SCOPES). Ignored while the feed is off.')
param platformConfirmScopes string = ''

@description('Set by the deployment: the webhook secret expires one year after it.')
param deploymentTime string = utcNow()

// Per region of the allowed list: true = availability zones, so zone-redundant storage (Standard_ZRS)
// and a zone-redundant Event Hubs namespace exist there; false = neither (Standard_LRS, no zones).
// The one table of the template's regions; its keys = the @allowed list of `location`.
// Sources, checked 2026-11-24: regions = Microsoft's Flex Consumption azd sample
// (Azure-Samples/functions-quickstart-python-http-azd, infra/main.bicep, @allowed of `location`, commit
// 0bb0f10); ZRS = learn.microsoft.com/azure/storage/common/redundancy-regions-zrs ("Standard storage
// accounts"; eastus2euap is listed there for premium block blobs only). Flex Consumption adds regions
// over time: `az functionapp list-flexconsumption-locations -o table` gives today's list.
var zoneRedundantByRegion = {
  australiaeast: true
  australiasoutheast: false
  brazilsouth: true
  canadacentral: true
  centralindia: true
  centralus: true
  eastasia: true
  eastus: true
  eastus2: true
  eastus2euap: false
  francecentral: true
  germanywestcentral: true
  italynorth: true
  japaneast: true
  koreacentral: true
  northcentralus: false
  northeurope: true
  norwayeast: true
  southafricanorth: true
  southcentralus: true
  southeastasia: true
  southindia: false
  spaincentral: true
  swedencentral: true
  uaenorth: true
  uksouth: true
  ukwest: false
  westcentralus: false
  westeurope: true
  westus: false
  westus2: true
  westus3: true
}
var zoneRedundant = zoneRedundantByRegion[location]
var storageSku = empty(storageSkuName) ? (zoneRedundant ? 'Standard_ZRS' : 'Standard_LRS') : storageSkuName

var resourceToken = toLower(uniqueString(subscription().id, environmentName, location))
var allTags = union(tags, {
  'azd-env-name': environmentName
})
var webhookSecretName = 'alert-webhook-url'
var deploymentContainerName = 'app-package-${take(resourceToken, 10)}'
var artifactsContainerName = 'forwarder-artifacts'
var captureContainerName = 'eventhub-capture'
var captureAccountName = 'stsec${resourceToken}' // (sealed-storage.bicep, only when Capture is on)
var functionAppName = 'func-se-${resourceToken}'
// Only whether a webhook URL was given leaves this file, never the (secure) URL itself.
var hasWebhookSecret = !empty(alertWebhookUrl)

resource rg 'Microsoft.Resources/resourceGroups@2024-03-01' = {
  name: empty(resourceGroupName) ? 'rg-${environmentName}' : resourceGroupName
  location: location
  tags: allTags
}

module identities 'app/identity.bicep' = {
  name: 'identities'
  scope: rg
  params: {
    location: location
    tags: allTags
    functionIdentityName: 'id-se-func-${resourceToken}'
    vmIdentityName: 'id-se-vm-${resourceToken}'
    captureIdentityName: 'id-se-capture-${resourceToken}'
  }
}

module monitoring 'app/monitoring.bicep' = {
  name: 'monitoring'
  scope: rg
  params: {
    location: location
    tags: allTags
    workspaceName: 'log-se-${resourceToken}'
    appInsightsName: 'appi-se-${resourceToken}'
    retentionInDays: logRetentionInDays
  }
}

module storage 'app/storage.bicep' = {
  name: 'storage'
  scope: rg
  params: {
    location: location
    tags: allTags
    storageAccountName: 'stse${resourceToken}'
    deploymentContainerName: deploymentContainerName
    publicNetworkAccess: storagePublicNetworkAccess
    skuName: storageSku
  }
}

module artifacts 'app/sealed-storage.bicep' = {
  name: 'artifacts'
  scope: rg
  params: {
    location: location
    tags: allTags
    storageAccountName: 'stsea${resourceToken}'
    containerName: artifactsContainerName
    publicNetworkAccess: storagePublicNetworkAccess
    skuName: storageSku
  }
}

// Capture's archive in an account of its own: the Function app's Blob Data Owner on the pipeline's account
// would let it delete or rewrite the record.
module captureStorage 'app/sealed-storage.bicep' = if (captureEnabled) {
  name: 'capture-storage'
  scope: rg
  params: {
    location: location
    tags: allTags
    storageAccountName: captureAccountName
    containerName: captureContainerName
    publicNetworkAccess: storagePublicNetworkAccess
    skuName: storageSku
  }
}

// Capture's role on its container first: the hub's module reads this module's output, so ARM deploys it
// after the role assignment exists (no resource is used by an identity before its role is assigned).
module captureAccess 'app/capture-access.bicep' = {
  name: 'capture-access'
  scope: rg
  dependsOn: [
    captureStorage
  ]
  params: {
    storageAccountName: captureAccountName
    captureContainerName: captureContainerName
    captureEnabled: captureEnabled
    capturePrincipalId: identities.outputs.captureIdentityPrincipalId
  }
}

module eventHubs 'app/eventhubs.bicep' = {
  name: 'eventhubs'
  scope: rg
  params: {
    location: location
    tags: allTags
    namespaceName: 'evhns-se-${resourceToken}'
    hubName: eventHubName
    platformHubName: '${eventHubName}-platform'
    partitionCount: eventHubPartitionCount
    messageRetentionInDays: eventHubRetentionDays
    capacity: eventHubCapacity
    publicNetworkAccess: eventHubsPublicNetworkAccess
    functionsConsumerGroupName: functionsConsumerGroupName
    analyticsConsumerGroupName: analyticsConsumerGroupName
    captureEnabled: captureEnabled
    captureStorageAccountId: resourceId(subscription().subscriptionId, rg.name, 'Microsoft.Storage/storageAccounts', captureAccountName)
    captureContainerName: captureContainerName
    captureIntervalInSeconds: captureIntervalInSeconds
    captureIdentityId: identities.outputs.captureIdentityId
    captureIdentityReady: captureAccess.outputs.captureIdentityReady
    zoneRedundant: zoneRedundant
  }
}

module keyVault 'app/keyvault.bicep' = {
  name: 'keyvault'
  scope: rg
  params: {
    location: location
    tags: allTags
    keyVaultName: 'kv-se-${take(resourceToken, 15)}${keyVaultNameSuffix}'
    publicNetworkAccess: keyVaultPublicNetworkAccess
    webhookSecretName: webhookSecretName
    alertWebhookUrl: alertWebhookUrl
    webhookSecretExpiry: dateTimeToEpoch(dateTimeAdd(deploymentTime, 'P1Y'))
  }
}

module roles 'app/roles.bicep' = {
  name: 'roles'
  scope: rg
  params: {
    storageAccountName: storage.outputs.accountName
    artifactsAccountName: artifacts.outputs.accountName
    artifactsContainerName: artifactsContainerName
    eventHubsNamespaceName: eventHubs.outputs.namespaceName
    eventHubName: eventHubs.outputs.hubName
    platformHubName: eventHubs.outputs.platformHubName
    keyVaultName: keyVault.outputs.vaultName
    webhookSecretName: webhookSecretName
    hasWebhookSecret: hasWebhookSecret
    appInsightsName: monitoring.outputs.appInsightsName
    functionPrincipalId: identities.outputs.functionIdentityPrincipalId
    vmPrincipalId: identities.outputs.vmIdentityPrincipalId
    operatorPrincipalIds: operatorPrincipalIds
    analystPrincipalIds: analystPrincipalIds
    captureAccountName: captureAccountName
    captureContainerName: captureContainerName
    captureEnabled: captureEnabled
  }
}

module functionApp 'app/function.bicep' = {
  name: 'function-app'
  scope: rg
  // The app starts reading the hub and the secret at once: its roles must exist first.
  dependsOn: [
    roles
  ]
  params: {
    location: location
    tags: allTags
    siteTags: union(allTags, {
      'azd-service-name': 'central'
    })
    planName: 'plan-se-${resourceToken}'
    functionAppName: functionAppName
    identityId: identities.outputs.functionIdentityId
    identityClientId: identities.outputs.functionIdentityClientId
    storageAccountName: storage.outputs.accountName
    deploymentContainerUrl: storage.outputs.deploymentContainerUrl
    eventHubsFullyQualifiedNamespace: eventHubs.outputs.fullyQualifiedNamespace
    eventHubName: eventHubs.outputs.hubName
    platformEventHubName: eventHubs.outputs.platformHubName
    consumerGroupName: eventHubs.outputs.functionsConsumerGroupName
    appInsightsConnectionString: monitoring.outputs.connectionString
    policyJson: policyJson
    policyShadowJson: policyShadowJson
    webhookSecretUri: hasWebhookSecret ? '${keyVault.outputs.vaultUri}secrets/${webhookSecretName}' : ''
    alertWebhookFormat: alertWebhookFormat
    statusAlertMinSeverity: statusAlertMinSeverity
    tablePrefix: tablePrefix
    reevaluateSchedule: reevaluateSchedule
    approvalResultTimeoutSeconds: approvalResultTimeoutSeconds
    approvalHookResultTimeoutSeconds: approvalHookResultTimeoutSeconds
    armApiVersion: armApiVersion
    leaderLivenessSeconds: leaderLivenessSeconds
    heartbeatMissingMinutes: heartbeatMissingMinutes
    alertMaxAttempts: alertMaxAttempts
    alertBackoffSeconds: alertBackoffSeconds
    alertTimeoutSeconds: alertTimeoutSeconds
    authnMode: authnMode
    platformConfirmScopes: platformFeedEnabled ? platformConfirmScopes : ''
    authnTrustPem: authnTrustPem
    authnHeldDays: authnHeldDays
    authnMetadataDomains: authnMetadataDomains
    operatorKeySha256: operatorKeySha256
    operatorApiClientId: operatorApiClientId
    maximumInstanceCount: functionMaximumInstanceCount
    instanceMemoryMB: functionInstanceMemoryMB
  }
}

// The platform's witness (issue 23), when on: a module, because the system topic is written at resource-group
// scope (its source is the subscription) and may live in another group when it already exists.
module platformFeed 'app/platform-feed.bicep' = if (platformFeedEnabled) {
  name: 'platform-feed'
  scope: resourceGroup(empty(platformSystemTopicResourceGroup) ? rg.name : platformSystemTopicResourceGroup)
  params: {
    existingTopicName: platformSystemTopicName
    newTopicName: 'evgt-se-maintenance-${resourceToken}'
    eventSubscriptionName: 'se-platform-${resourceToken}'
    platformHubId: eventHubs.outputs.platformHubId
    tags: allTags
  }
}

// Operators sign in: App Service authentication in front of the app (401 without a token).
module auth 'app/auth.bicep' = {
  name: 'function-auth'
  scope: rg
  params: {
    functionAppName: functionApp.outputs.functionAppName
    operatorApiClientId: operatorApiClientId
    excludedPaths: [
      '/api/health'
      '/api/automation/*'
      '/api/console'
      '/api/console/*'
    ]
  }
}

module alerts 'app/alerts.bicep' = {
  name: 'alerts'
  scope: rg
  params: {
    location: location
    tags: allTags
    actionGroupName: 'ag-se-${resourceToken}'
    actionGroupShortName: 'se-alerts'
    alertEmailAddress: alertEmailAddress
    workspaceId: monitoring.outputs.workspaceId
    functionAppName: functionApp.outputs.functionAppName
    heartbeatMissingMinutes: heartbeatMissingMinutes
    heartbeatLogMarker: heartbeatLogMarker
    outboxDropLogMarker: outboxDropLogMarker
  }
}

module workbook 'app/workbook.bicep' = {
  name: 'workbook'
  scope: rg
  params: {
    location: location
    tags: allTags
    displayName: 'Scheduled events (${environmentName})'
    workspaceId: monitoring.outputs.workspaceId
    silentMinutes: heartbeatMissingMinutes
  }
}

// azd stores these in its environment (`azd env get-values`); infra/forwarder/install-on-vms.sh reads
// them from there or from the deployment (its name does not matter: docs/deploy.md).
output SE_ENVIRONMENT_NAME string = environmentName
output AZURE_LOCATION string = location
output AZURE_RESOURCE_GROUP string = rg.name
output AZURE_FUNCTION_APP_NAME string = functionApp.outputs.functionAppName
// The on-call console (postprovision adds it to the operator API's SPA redirect URIs; docs/console.md)
output SE_CONSOLE_URL string = 'https://${functionApp.outputs.defaultHostName}/api/console/'
output EVENTHUB_NAMESPACE string = eventHubs.outputs.fullyQualifiedNamespace
output EVENTHUB_NAME string = eventHubs.outputs.hubName
output ANALYTICS_CONSUMER_GROUP string = eventHubs.outputs.analyticsConsumerGroupName
output STORAGE_ACCOUNT_NAME string = storage.outputs.accountName
output STORAGE_ACCOUNT_ID string = storage.outputs.accountId
output QUEUE_SERVICE_URI string = storage.outputs.queueEndpoint
output TABLE_SERVICE_URI string = storage.outputs.tableEndpoint
output FORWARDER_ARTIFACTS_URL string = artifacts.outputs.containerUrl
output ARTIFACTS_STORAGE_ACCOUNT_NAME string = artifacts.outputs.accountName
output CAPTURE_STORAGE_ACCOUNT_NAME string = captureEnabled ? captureAccountName : ''
output VM_IDENTITY_ID string = identities.outputs.vmIdentityId
output VM_IDENTITY_CLIENT_ID string = identities.outputs.vmIdentityClientId
// install-on-vms.sh --platform-feed / --agentless: central's identity gets Scheduled Events Contributor on
// the opted-in VMs, scale sets and availability sets.
output FUNCTION_PRINCIPAL_ID string = identities.outputs.functionIdentityPrincipalId
output PLATFORM_FEED_ENABLED bool = platformFeedEnabled
output PLATFORM_SYSTEM_TOPIC string = platformFeedEnabled ? platformFeed!.outputs.topicId : ''
output KEY_VAULT_NAME string = keyVault.outputs.vaultName
output ACTION_GROUP_ID string = alerts.outputs.actionGroupId
