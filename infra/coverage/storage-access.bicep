// The policy assignment's identity may create approval queues in the pipeline's storage account, and
// nowhere else (Storage Account Contributor on that account only). Deployed by main.bicep / main-mg.bicep
// into the storage account's resource group.
@description('Name of the pipeline\'s storage account (STORAGE_ACCOUNT_ID output of infra/main.bicep).')
param storageAccountName string

@description('Principal id of the policy assignment\'s system-assigned identity.')
param principalId string

var storageAccountContributor = '17d1049b-9a84-46fb-8f53-869881c3d3ab' // Storage Account Contributor

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource queues 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(account.id, principalId, storageAccountContributor)
  scope: account
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageAccountContributor)
  }
}
