// User-assigned identities with separate jobs, so each gets only its own roles: the Function app (reads
// events, sends approvals), the VMs' forwarders (send events; each VM takes its approvals with its own
// system-assigned identity, granted by the forwarder install) and Event Hubs Capture
// (writes Avro files). Created first, so every role can be assigned before the identity is used.
@description('Azure region.')
param location string

@description('Tags put on every resource.')
param tags object

@description('Name of the Function app identity.')
param functionIdentityName string

@description('Name of the identity the forwarders on the VMs use.')
param vmIdentityName string

@description('Name of the identity Event Hubs Capture writes blobs with (holds a role only when Capture is on).')
param captureIdentityName string

resource functionIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: functionIdentityName
  location: location
  tags: tags
}

resource vmIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: vmIdentityName
  location: location
  tags: tags
}

resource captureIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: captureIdentityName
  location: location
  tags: tags
}

output functionIdentityId string = functionIdentity.id
output functionIdentityClientId string = functionIdentity.properties.clientId
output functionIdentityPrincipalId string = functionIdentity.properties.principalId
output vmIdentityId string = vmIdentity.id
output vmIdentityClientId string = vmIdentity.properties.clientId
output vmIdentityPrincipalId string = vmIdentity.properties.principalId
output captureIdentityId string = captureIdentity.id
output captureIdentityPrincipalId string = captureIdentity.properties.principalId
