// The forwarder's config file (/etc/se-forwarder/config.json, or C:\ProgramData\se-forwarder\config.json)
// built from the deployment's outputs. Keys are forwarder/config.py's setting keys (snake_case; the
// same settings are also SE_FORWARDER_<KEY> env vars and --<key> flags). No secret is in it: the VM
// sends events with the shared user-assigned identity (client_id) and reads its approval queue with its
// own system-assigned identity (queue_client_id empty).
@description('Linux or Windows.')
@allowed([
  'Linux'
  'Windows'
])
param osType string

@description('Event Hubs fully qualified namespace (EVENTHUB_NAMESPACE output of main.bicep).')
param eventHubNamespace string

@description('Event Hub name (EVENTHUB_NAME output).')
param eventHubName string

@description('Client id of the VMs user-assigned identity (VM_IDENTITY_CLIENT_ID output).')
param vmIdentityClientId string

@description('Queue service URI of the approval queues (QUEUE_SERVICE_URI output); empty: no central approvals.')
param queueServiceUri string

@description('Extra forwarder settings (config keys of forwarder/config.py), e.g. {"heartbeat_interval": 60}.')
param extraSettings object

var stateDir = osType == 'Linux' ? '/var/lib/se-forwarder' : 'C:\\ProgramData\\se-forwarder\\state'
var hookDir = osType == 'Linux' ? '/etc/se-forwarder/hooks' : 'C:\\ProgramData\\se-forwarder\\hooks'

var baseSettings = {
  sink: 'eventhub'
  eventhub_namespace: eventHubNamespace
  eventhub_name: eventHubName
  client_id: vmIdentityClientId
  queue_service_uri: queueServiceUri
  // Empty: the queue is read with the VM's system-assigned identity (Uniform: the scale set's), the one
  // queue-access.bicep scopes to its own queue; client_id above stays the hub's shared identity.
  queue_client_id: ''
  state_dir: stateDir
  hook_dir: hookDir
  // Sign every envelope (central's default AUTHN_MODE=required refuses unsigned ones). Explicit here,
  // though the forwarder defaults to it on the Event Hubs sink, so the installed config says so.
  authenticate: true
}

var settings = union(baseSettings, extraSettings)

output settings object = settings
output settingsBase64 string = base64(string(settings))
