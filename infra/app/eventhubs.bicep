// Event Hubs: the namespace (local/SAS auth off, TLS 1.2), the hub the forwarders publish to
// (partition key = the VM's scale set, else its vmId: one VM in order, one scale set on one reader), a consumer group for the central Functions and one for
// analytics, and optional Capture to blob storage (authenticated with a user-assigned identity whose
// role main.bicep assigns before this module runs: app/capture-access.bicep).
@description('Azure region.')
param location string

@description('Tags put on every resource.')
param tags object

@description('Event Hubs namespace name.')
param namespaceName string

@description('Event Hub name.')
param hubName string

@description('Hub Event Grid delivers the platform\'s own scheduled events to (the system topic\'s identity is its only sender).')
param platformHubName string

@description('Partitions of the hub (fixed after creation on Standard).')
@minValue(1)
@maxValue(32)
param partitionCount int

@description('Days messages stay in the hub (Standard: 1-7).')
@minValue(1)
@maxValue(7)
param messageRetentionInDays int

@description('Throughput units of the Standard namespace.')
@minValue(1)
@maxValue(40)
param capacity int

@description('Enabled or Disabled: public network access to the namespace.')
@allowed([
  'Enabled'
  'Disabled'
  'SecuredByPerimeter'
])
param publicNetworkAccess string

@description('Consumer group the central Functions read with.')
param functionsConsumerGroupName string

@description('Consumer group for downstream analytics.')
param analyticsConsumerGroupName string

@description('Turn on Capture to blob storage.')
param captureEnabled bool

@description('Storage account resource id Capture writes to.')
param captureStorageAccountId string

@description('Blob container Capture writes to.')
param captureContainerName string

@description('Seconds between Capture files.')
@minValue(60)
@maxValue(900)
param captureIntervalInSeconds int

@description('Resource id of the user-assigned identity Capture writes with.')
param captureIdentityId string

@description('Its role on the Capture container exists (output of app/capture-access.bicep).')
param captureIdentityReady bool

@description('Zone redundancy: true only in a region with availability zones (main.bicep\'s region table).')
param zoneRedundant bool

resource namespace 'Microsoft.EventHub/namespaces@2024-01-01' = {
  name: namespaceName
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Standard'
    capacity: capacity
  }
  // Capture writes with this identity (storage shared keys are off); it has no other role.
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${captureIdentityId}': {}
    }
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: publicNetworkAccess
    isAutoInflateEnabled: false
    zoneRedundant: zoneRedundant
  }
}

resource hub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' = {
  parent: namespace
  name: hubName
  properties: {
    partitionCount: partitionCount
    messageRetentionInDays: messageRetentionInDays
    captureDescription: captureEnabled && captureIdentityReady ? {
      enabled: true
      encoding: 'Avro'
      intervalInSeconds: captureIntervalInSeconds
      sizeLimitInBytes: 314572800
      skipEmptyArchives: true
      destination: {
        name: 'EventHubArchive.AzureBlockBlob'
        identity: {
          type: 'UserAssigned'
          userAssignedIdentity: captureIdentityId
        }
        properties: {
          storageAccountResourceId: captureStorageAccountId
          blobContainer: captureContainerName
          archiveNameFormat: '{Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}'
        }
      }
    } : null
  }
}

resource functionsConsumerGroup 'Microsoft.EventHub/namespaces/eventhubs/consumergroups@2024-01-01' = {
  parent: hub
  name: functionsConsumerGroupName
  properties: {
    userMetadata: 'Central Functions (policy, log store, approvals).'
  }
}

resource analyticsConsumerGroup 'Microsoft.EventHub/namespaces/eventhubs/consumergroups@2024-01-01' = {
  parent: hub
  name: analyticsConsumerGroupName
  properties: {
    userMetadata: 'Downstream analytics; reads independently of the Functions.'
  }
}

// The platform's witness (issue 23): Event Grid's MaintenanceResources events land here, never on the
// forwarders' hub, so no VM (Data Sender on that hub) can speak as the platform. Always created (an empty hub
// costs nothing on Standard) so the Functions trigger binds whether the feed is on or off.
resource platformHub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' = {
  parent: namespace
  name: platformHubName
  properties: {
    partitionCount: 2
    messageRetentionInDays: messageRetentionInDays
  }
}

resource platformConsumerGroup 'Microsoft.EventHub/namespaces/eventhubs/consumergroups@2024-01-01' = {
  parent: platformHub
  name: functionsConsumerGroupName
  properties: {
    userMetadata: 'Central Functions (the platform feed).'
  }
}

output namespaceId string = namespace.id
output namespaceName string = namespace.name
output fullyQualifiedNamespace string = '${namespace.name}.servicebus.windows.net'
output hubId string = hub.id
output hubName string = hub.name
output platformHubId string = platformHub.id
output platformHubName string = platformHub.name
output functionsConsumerGroupName string = functionsConsumerGroup.name
output analyticsConsumerGroupName string = analyticsConsumerGroup.name
