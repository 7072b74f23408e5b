// The Capture identity's write access to its container, assigned BEFORE the hub turns Capture on:
// main.bicep deploys the Event Hubs module only after this one (Microsoft lists the role as a
// prerequisite of Capture with a managed identity: learn.microsoft.com/azure/event-hubs/
// event-hubs-capture-managed-identity). Nothing here when Capture is off.
@description('Storage account that holds the Capture container.')
param storageAccountName string

@description('Blob container Capture writes to.')
param captureContainerName string

@description('Capture is on: assign the role.')
param captureEnabled bool

@description('Principal id of the Capture user-assigned identity.')
param capturePrincipalId string

var blobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe' // Storage Blob Data Contributor

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: account
  name: 'default'
}

resource captureContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: captureContainerName
}

// Write Capture files. Scope: the capture container only.
resource captureWriter 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (captureEnabled) {
  name: guid(captureContainer.id, capturePrincipalId, blobDataContributor)
  scope: captureContainer
  properties: {
    principalId: capturePrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', blobDataContributor)
  }
}

// The hub's module takes this output: a reference that orders the deployments as well as dependsOn.
output captureIdentityReady bool = captureEnabled
