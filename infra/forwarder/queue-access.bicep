// Approvals are per VM: the identity given here can receive and delete messages of the queues named
// here and of no other. For each vmId: the queue vm-<vmId> (central's rule for a VM id, a GUID:
// central/runtime/approval_queue.py queue_name; central would create it on first use, this creates it now so the
// role can be scoped to it) and Storage Queue Data Message Processor on that queue only.
// Deployed by install-vm.bicep (one VM, its system-assigned identity, its own queue) and
// install-vmss.bicep (a Uniform scale set: its one identity, the queues of its instances) into the
// resource group of the pipeline's storage account.
@description('Name of the pipeline\'s storage account (STORAGE_ACCOUNT_ID output of main.bicep).')
param storageAccountName string

@description('Principal id of the system-assigned identity that reads the queues.')
param principalId string

@description('vmIds (GUIDs) whose queues this identity may read.')
param vmIds array

var messageProcessor = '8a0f0c08-91a1-4084-bc3d-661d67233fed' // Storage Queue Data Message Processor

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' existing = {
  parent: account
  name: 'default'
}

resource queues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [for vmId in vmIds: {
  parent: queueService
  name: 'vm-${toLower(vmId)}'
}]

// Peek, receive, delete: it cannot add a message, so no VM can send an approval, to itself or another.
resource processor 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (vmId, i) in vmIds: {
  name: guid(queues[i].id, principalId, messageProcessor)
  scope: queues[i]
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', messageProcessor)
  }
}]

output queueNames array = [for vmId in vmIds: 'vm-${toLower(vmId)}']
