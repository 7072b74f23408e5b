// Coverage in central's fleet view (issue 48): central reads the VMs of COVERAGE_SCOPES from Azure Resource
// Graph, which returns only what the caller may read. Reader on the subscription is the built-in role that
// covers every row the coverage queries read (VMs, scale sets and their instances, availability sets,
// extensions, role assignments) and nothing more than reading; no write, no data-plane access.
// Deployed by main.bicep only when coverageScopes lists this subscription.
targetScope = 'subscription'

@description('Principal id of the Function app identity.')
param functionPrincipalId string

// Reader (built-in): acdd72a7-3385-48ef-bd42-f606fba81ae7
var reader = 'acdd72a7-3385-48ef-bd42-f606fba81ae7'

resource coverageReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(subscription().id, functionPrincipalId, reader)
  properties: {
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', reader)
  }
}
