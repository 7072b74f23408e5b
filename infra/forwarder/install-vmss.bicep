// Installs the forwarder on an existing VM scale set (its model) with the CustomScript extension: the VM downloads the
// wheelhouse bundle and the install script from the artifacts container with its user-assigned
// managed identity (no SAS, no keys), installs offline (no PyPI), writes the config and starts the
// service (systemd unit on Linux, a startup task on Windows). Run it in the VM's resource group.
// Approvals: a Uniform scale set's instances share one identity (its system-assigned one), so they are
// isolated per scale set at best: that identity gets the right to take messages from the queues of the
// instances listed in instanceVmIds, and of no other VM (queue-access.bicep).
// Before: attach both identities (`az vmss identity assign --identities [system] <VM_IDENTITY_ID>`,
// install-on-vms.sh does it): a partial PUT of an existing scale set would have to restate it.
@maxLength(64)
@description('Name of the existing scale set (in this deployment\'s resource group).')
param vmssName string

@description('Linux or Windows.')
@allowed([
  'Linux'
  'Windows'
])
param osType string

@description('Blob container URL of the forwarder artifacts (FORWARDER_ARTIFACTS_URL output of main.bicep).')
param artifactsUrl string

@description('Event Hubs fully qualified namespace (EVENTHUB_NAMESPACE output).')
param eventHubNamespace string

@description('Event Hub name (EVENTHUB_NAME output).')
param eventHubName string

@description('Client id of the VMs identity (VM_IDENTITY_CLIENT_ID output); must be attached to the VM.')
param vmIdentityClientId string

@description('Queue service URI of the approval queues (QUEUE_SERVICE_URI output); empty: no central approvals.')
param queueServiceUri string = ''

@description('Resource id of the pipeline\'s storage account (STORAGE_ACCOUNT_ID output).')
param storageAccountId string

@description('vmIds of the scale set\'s instances now (`az vmss list-instances --query "[].vmId"`): the scale set\'s one system-assigned identity gets Storage Queue Data Message Processor on each of their queues. An instance added later gets access when the install runs again.')
param instanceVmIds array = []

@description('Extra forwarder settings (config keys of forwarder/config.py).')
param extraSettings object = {}

@description('Change it to re-run the install (e.g. a new wheelhouse with the same file names).')
param forceUpdateTag string = '1'

resource vmss 'Microsoft.Compute/virtualMachineScaleSets@2024-07-01' existing = {
  name: vmssName
}

module config 'config.bicep' = {
  // A deployment name holds at most 64 characters: a short prefix, part of the name, a hash of all of it.
  name: 'se-fwd-cfg-${take(vmssName, 30)}-${uniqueString(resourceGroup().id, vmssName)}'
  params: {
    osType: osType
    eventHubNamespace: eventHubNamespace
    eventHubName: eventHubName
    vmIdentityClientId: vmIdentityClientId
    queueServiceUri: queueServiceUri
    extraSettings: extraSettings
  }
}

// The queue(s) and the role, in the storage account's resource group (and subscription).
module queueAccess 'queue-access.bicep' = if (!empty(instanceVmIds)) {
  name: 'se-fwd-q-${take(vmssName, 30)}-${uniqueString(resourceGroup().id, vmssName)}'
  scope: resourceGroup(split(storageAccountId, '/')[2], split(storageAccountId, '/')[4])
  params: {
    storageAccountName: last(split(storageAccountId, '/'))
    principalId: vmss.identity.principalId
    vmIds: instanceVmIds
  }
}

var linuxCommand = 'bash install-forwarder.sh --bundle se-forwarder-linux.tar.gz --config-base64 ${config.outputs.settingsBase64}'
var windowsCommand = 'powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -File install-forwarder.ps1 -Bundle se-forwarder-windows.zip -ConfigBase64 ${config.outputs.settingsBase64}'

resource linuxInstall 'Microsoft.Compute/virtualMachineScaleSets/extensions@2024-07-01' = if (osType == 'Linux') {
  parent: vmss
  // The forwarder reads its queue as soon as it starts: the role exists first.
  dependsOn: [
    queueAccess
  ]
  name: 'se-forwarder-install-linux'
  properties: {
    publisher: 'Microsoft.Azure.Extensions'
    type: 'CustomScript'
    typeHandlerVersion: '2.1'
    autoUpgradeMinorVersion: true
    forceUpdateTag: forceUpdateTag
    settings: {}
    protectedSettings: {
      fileUris: [
        '${artifactsUrl}/install-forwarder.sh'
        '${artifactsUrl}/se-forwarder-linux.tar.gz'
      ]
      commandToExecute: linuxCommand
      managedIdentity: {
        clientId: vmIdentityClientId
      }
    }
  }
}

resource windowsInstall 'Microsoft.Compute/virtualMachineScaleSets/extensions@2024-07-01' = if (osType == 'Windows') {
  parent: vmss
  // The forwarder reads its queue as soon as it starts: the role exists first.
  dependsOn: [
    queueAccess
  ]
  name: 'se-forwarder-install-windows'
  properties: {
    publisher: 'Microsoft.Compute'
    type: 'CustomScriptExtension'
    typeHandlerVersion: '1.10'
    autoUpgradeMinorVersion: true
    forceUpdateTag: forceUpdateTag
    settings: {}
    protectedSettings: {
      fileUris: [
        '${artifactsUrl}/install-forwarder.ps1'
        '${artifactsUrl}/se-forwarder-windows.zip'
      ]
      commandToExecute: windowsCommand
      managedIdentity: {
        clientId: vmIdentityClientId
      }
    }
  }
}

output settings object = config.outputs.settings
// Instances pick the extension up when they are brought to the latest model: automatically with an
// Automatic or Rolling upgrade policy, else `az vmss update-instances --instance-ids '*'` (docs/deploy.md).
