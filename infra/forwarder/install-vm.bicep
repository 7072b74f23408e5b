// Installs the forwarder on one existing VM with the CustomScript extension: the VM downloads the
// wheelhouse bundle and the install script from the artifacts container with the shared user-assigned
// managed identity (no SAS, no keys), installs offline (no PyPI), writes the config and starts the
// service (systemd unit on Linux, a startup task on Windows). Run it in the VM's resource group.
// Approvals are per VM: the VM's own system-assigned identity gets the right to take messages from its
// own queue vm-<vmId> only (queue-access.bicep, in the storage account's resource group).
// Before: attach both identities (`az vm identity assign --identities [system] <VM_IDENTITY_ID>`,
// install-on-vms.sh does it): a partial PUT of an existing VM from a template would have to restate it.
@maxLength(64)
@description('Name of the existing VM (in this deployment\'s resource group).')
param vmName string

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

@description('Resource id of the pipeline\'s storage account (STORAGE_ACCOUNT_ID output). The VM\'s system-assigned identity (attached before: install-on-vms.sh) gets Storage Queue Data Message Processor on its own queue there, and on no other.')
param storageAccountId string

@description('Extra forwarder settings (config keys of forwarder/config.py).')
param extraSettings object = {}

@description('Change it to re-run the install (e.g. a new wheelhouse with the same file names).')
param forceUpdateTag string = '1'

resource vm 'Microsoft.Compute/virtualMachines@2024-07-01' existing = {
  name: vmName
}

module config 'config.bicep' = {
  // A deployment name holds at most 64 characters: a short prefix, part of the name, a hash of all of it.
  name: 'se-fwd-cfg-${take(vmName, 30)}-${uniqueString(resourceGroup().id, vmName)}'
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
module queueAccess 'queue-access.bicep' = {
  name: 'se-fwd-q-${take(vmName, 30)}-${uniqueString(resourceGroup().id, vmName)}'
  scope: resourceGroup(split(storageAccountId, '/')[2], split(storageAccountId, '/')[4])
  params: {
    storageAccountName: last(split(storageAccountId, '/'))
    principalId: vm.identity.principalId
    vmIds: [
      vm.properties.vmId
    ]
  }
}

var linuxCommand = 'bash install-forwarder.sh --bundle se-forwarder-linux.tar.gz --config-base64 ${config.outputs.settingsBase64}'
var windowsCommand = 'powershell.exe -NoProfile -NonInteractive -ExecutionPolicy Bypass -File install-forwarder.ps1 -Bundle se-forwarder-windows.zip -ConfigBase64 ${config.outputs.settingsBase64}'

resource linuxInstall 'Microsoft.Compute/virtualMachines/extensions@2024-07-01' = if (osType == 'Linux') {
  parent: vm
  // The forwarder reads its queue as soon as it starts: the role exists first.
  dependsOn: [
    queueAccess
  ]
  name: 'se-forwarder-install-linux'
  location: vm.location
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

resource windowsInstall 'Microsoft.Compute/virtualMachines/extensions@2024-07-01' = if (osType == 'Windows') {
  parent: vm
  // The forwarder reads its queue as soon as it starts: the role exists first.
  dependsOn: [
    queueAccess
  ]
  name: 'se-forwarder-install-windows'
  location: vm.location
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
