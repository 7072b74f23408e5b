// Every role assignment of the pipeline, each on the narrowest scope that works.
// Built-in role definition ids are global constants; each GUID has its role's name beside it.
@description('Storage account name.')
param storageAccountName string

@description('Storage account of the forwarder artifacts (sealed-storage.bicep).')
param artifactsAccountName string

@description('Blob container of the forwarder artifacts (VMs read it while installing).')
param artifactsContainerName string

@description('Event Hubs namespace name.')
param eventHubsNamespaceName string

@description('Event Hub name.')
param eventHubName string

@description('Event Hub the platform feed is delivered to.')
param platformHubName string

@description('Key Vault name.')
param keyVaultName string

@description('Name of the webhook secret.')
param webhookSecretName string

@description('The webhook secret exists (a webhook URL was given).')
param hasWebhookSecret bool

@description('Application Insights name.')
param appInsightsName string

@description('Principal id of the Function app identity.')
param functionPrincipalId string

@description('Principal id of the VMs\' shared identity (sends events, reads the artifacts; no queue role).')
param vmPrincipalId string

@description('Object ids of operators (users or groups) who read the log store, e.g. for se-policy whatif --since.')
param operatorPrincipalIds array

@description('Object ids of analysts (users or groups): read the Capture files, and receive from the hub.')
param analystPrincipalIds array

@description('Storage account of the Capture archive (sealed-storage.bicep; exists when Capture is on).')
param captureAccountName string

@description('Blob container Event Hubs Capture writes to (in that account).')
param captureContainerName string

@description('Capture is on (the container exists): analysts get their read role on it.')
param captureEnabled bool

var roles = {
  eventHubsDataReceiver: 'a638d3c7-ab3a-418d-83e6-5f17a39d4fde' // Azure Event Hubs Data Receiver
  eventHubsDataSender: '2b629674-e913-4c01-ae53-ef4638d8f975' // Azure Event Hubs Data Sender
  queueMessageSender: 'c6a89b2d-59bc-44d0-9896-0f6e12d7b80a' // Storage Queue Data Message Sender
  tableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3' // Storage Table Data Contributor
  tableDataReader: '76199698-9eea-4c19-bc75-cec21354c6b6' // Storage Table Data Reader
  blobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b' // Storage Blob Data Owner
  blobDataReader: '2a2b9908-6ea1-4ae2-8e65-a410df84e7d1' // Storage Blob Data Reader
  keyVaultSecretsUser: '4633458b-17de-408a-b874-0445c86b69e6' // Key Vault Secrets User
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb' // Monitoring Metrics Publisher
}

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource captureAccount 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: captureAccountName
}

resource captureBlobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: captureAccount
  name: 'default'
}

resource captureContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: captureBlobService
  name: captureContainerName
}

resource artifactsAccount 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: artifactsAccountName
}

resource artifactsBlobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: artifactsAccount
  name: 'default'
}

resource artifactsContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: artifactsBlobService
  name: artifactsContainerName
}

resource namespace 'Microsoft.EventHub/namespaces@2024-01-01' existing = {
  name: eventHubsNamespaceName
}

resource hub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' existing = {
  parent: namespace
  name: eventHubName
}

resource platformHub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' existing = {
  parent: namespace
  name: platformHubName
}

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' existing = {
  name: keyVaultName
}

resource webhookSecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' existing = {
  parent: vault
  name: webhookSecretName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

// Only the central package may create approval queues (one per VM, named from the vmId, created on
// first use). No built-in data role carries queue creation without also reading or deleting every
// message, so this custom role holds the one control-plane action the Create Queue call checks.
resource queueCreatorRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: guid(resourceGroup().id, 'scheduled-events-approval-queue-creator')
  properties: {
    roleName: 'Scheduled Events approval queue creator (${uniqueString(resourceGroup().id)})'
    description: 'Create Storage queues (no message access). Held by the central Functions so each VM gets its approval queue on first use.'
    type: 'CustomRole'
    permissions: [
      {
        actions: [
          'Microsoft.Storage/storageAccounts/queueServices/queues/write'
        ]
        notActions: []
        dataActions: []
        notDataActions: []
      }
    ]
    assignableScopes: [
      resourceGroup().id
    ]
  }
}

// ---- The Function app identity ----

// Read the hub with the Functions consumer group (trigger). Scope: this hub only.
resource fnHubReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(hub.id, functionPrincipalId, roles.eventHubsDataReceiver)
  scope: hub
  properties: {
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.eventHubsDataReceiver)
  }
}

// Read the platform hub (issue 23) with the same consumer group. Scope: that hub only.
resource fnPlatformHubReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(platformHub.id, functionPrincipalId, roles.eventHubsDataReceiver)
  scope: platformHub
  properties: {
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.eventHubsDataReceiver)
  }
}

// Put approval messages on the per-VM queues. Add only: it cannot read or delete them.
resource fnQueueSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account.id, functionPrincipalId, roles.queueMessageSender)
  scope: account
  properties: {
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.queueMessageSender)
  }
}

// Create a VM's approval queue when it is missing.
resource fnQueueCreator 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account.id, functionPrincipalId, queueCreatorRole.id)
  scope: account
  properties: {
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: queueCreatorRole.id
  }
}

// The log store (incarnations, events, decisions): create tables, read and write entities.
resource fnTables 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account.id, functionPrincipalId, roles.tableDataContributor)
  scope: account
  properties: {
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.tableDataContributor)
  }
}

// Operators read the log store (se-policy whatif --since; analytics): entities only, nothing written.
resource operatorTables 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principalId in operatorPrincipalIds: {
  name: guid(account.id, principalId, roles.tableDataReader)
  scope: account
  properties: {
    principalId: principalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.tableDataReader)
  }
}]

// Analysts read the Capture files (their default path: docs/analytics.md). Scope: the Capture container only,
// not the account (host storage and the log store live there too).
resource analystCapture 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principalId in (captureEnabled ? analystPrincipalIds : []): {
  name: guid(captureContainer.id, principalId, roles.blobDataReader)
  scope: captureContainer
  properties: {
    principalId: principalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.blobDataReader)
  }
}]

// Analysts may also read the stream live. Event Hubs data roles stop at the hub: no role can be scoped to
// one consumer group, so this lets them read through ANY consumer group, central's included (reading never
// moves central's checkpoints, which live in host storage; docs/analytics.md says what it allows).
resource analystHub 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principalId in analystPrincipalIds: {
  name: guid(hub.id, principalId, roles.eventHubsDataReceiver)
  scope: hub
  properties: {
    principalId: principalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.eventHubsDataReceiver)
  }
}]

// Host storage (AzureWebJobsStorage): blob leases for the timer, Event Hubs checkpoints, the key
// store, creating its own containers; and reading the Flex deployment package. Microsoft documents
// Storage Blob Data Owner as the minimum for identity-based host storage. (The forwarder artifacts are
// in another account, so this role cannot touch code the VMs install.)
resource fnBlobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account.id, functionPrincipalId, roles.blobDataOwner)
  scope: account
  properties: {
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.blobDataOwner)
  }
}

// Read the webhook URL secret through the Key Vault reference. Scope: that one secret.
resource fnSecretUser 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (hasWebhookSecret) {
  name: guid(vault.id, webhookSecretName, functionPrincipalId, roles.keyVaultSecretsUser)
  scope: webhookSecret
  properties: {
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.keyVaultSecretsUser)
  }
}

// Send telemetry to Application Insights with Entra auth (local auth is off on the component).
resource fnTelemetry 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, functionPrincipalId, roles.monitoringMetricsPublisher)
  scope: appInsights
  properties: {
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.monitoringMetricsPublisher)
  }
}

// ---- The VMs' identity (forwarders) ----

// Publish envelopes to the hub. Send only: it cannot read other VMs' events.
resource vmHubSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(hub.id, vmPrincipalId, roles.eventHubsDataSender)
  scope: hub
  properties: {
    principalId: vmPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.eventHubsDataSender)
  }
}

// No VM role on the approval queues here: each VM's own identity gets Storage Queue Data Message
// Processor on its own queue only, from the forwarder install (infra/forwarder/queue-access.bicep).

// Download the wheelhouse and install scripts (CustomScript extension with managed identity).
// Scope: the artifacts container only, read only.
resource vmArtifactsReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(artifactsContainer.id, vmPrincipalId, roles.blobDataReader)
  scope: artifactsContainer
  properties: {
    principalId: vmPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.blobDataReader)
  }
}

output queueCreatorRoleId string = queueCreatorRole.id
