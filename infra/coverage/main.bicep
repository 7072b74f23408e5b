// Every VM of a subscription covered: the "se-coverage" initiative (infra/coverage/definitions/*.json) and
// its assignment, whose managed identity remediation deploys with. docs/deploy.md, "Cover a whole
// subscription". Deploy (after infra/main.bicep; its outputs are the parameters):
//   az deployment sub create -l <region> -f infra/coverage/main.bicep -p infra/coverage/main.bicepparam
// Remediate the VMs that exist already: infra/coverage/remediate.sh (one az policy remediation per
// definition of the initiative). A management group: main-mg.bicep, the same with `az deployment mg create`.
targetScope = 'subscription'

@description('Region of the assignment\'s managed identity.')
param location string

@description('FORWARDER_ARTIFACTS_URL output of infra/main.bicep.')
param artifactsUrl string

@description('EVENTHUB_NAMESPACE output.')
param eventHubNamespace string

@description('EVENTHUB_NAME output.')
param eventHubName string

@description('VM_IDENTITY_ID output: the VMs\' shared user-assigned identity (sends events, reads the bundle).')
param vmIdentityId string

@description('VM_IDENTITY_CLIENT_ID output.')
param vmIdentityClientId string

@description('QUEUE_SERVICE_URI output; empty: no central approvals.')
param queueServiceUri string = ''

@description('STORAGE_ACCOUNT_ID output: each VM\'s approval queue and its role go there.')
param storageAccountId string

@description('FUNCTION_PRINCIPAL_ID output: central\'s identity, Scheduled Events Contributor at each opted-in owner.')
param centralPrincipalId string

@description('Tag that opts a VM, scale set or availability set out.')
param exclusionTagName string = 'se-forwarder'

@description('Value of that tag: left alone (no forwarder, no platform feed).')
param offValue string = 'off'

@description('Value of that tag: platform feed only, no forwarder.')
param agentlessValue string = 'agentless'

@description('Install the forwarder (DeployIfNotExists), only report VMs without it (AuditIfNotExists), or neither.')
@allowed([
  'DeployIfNotExists'
  'AuditIfNotExists'
  'Disabled'
])
param forwarderEffect string = 'DeployIfNotExists'

@description('Opt owners into the platform feed (Modify), only report (Audit), or neither. Needs the feed\'s preview features registered.')
@allowed([
  'Modify'
  'Audit'
  'Disabled'
])
param platformFeedEffect string = 'Modify'

@description('Policy assignment name (at most 64 characters at a subscription).')
@maxLength(64)
param assignmentName string = 'se-coverage'

var initiative = loadJsonContent('initiative.json')
// Policy definitions as Azure stores them (the rules are tested as JSON: tests/infra/test_coverage_policy.py).
var bodies = {
  'forwarder-vm': loadJsonContent('definitions/forwarder-vm.json')
  'forwarder-vmss': loadJsonContent('definitions/forwarder-vmss.json')
  'feed-opt-in': loadJsonContent('definitions/feed-opt-in.json')
  'feed-role': loadJsonContent('definitions/feed-role.json')
}
// central's role follows the opt-in: deployed with it, reported with it, or neither
var roleEffects = {
  Modify: 'DeployIfNotExists'
  Audit: 'AuditIfNotExists'
  Disabled: 'Disabled'
}
// The assignment's parameter values (the initiative's parameters: initiative.json)
var assignmentParameters = {
  artifactsUrl: {
    value: artifactsUrl
  }
  eventHubNamespace: {
    value: eventHubNamespace
  }
  eventHubName: {
    value: eventHubName
  }
  vmIdentityId: {
    value: vmIdentityId
  }
  vmIdentityClientId: {
    value: vmIdentityClientId
  }
  queueServiceUri: {
    value: queueServiceUri
  }
  storageAccountId: {
    value: storageAccountId
  }
  centralPrincipalId: {
    value: centralPrincipalId
  }
  exclusionTagName: {
    value: exclusionTagName
  }
  offValue: {
    value: offValue
  }
  agentlessValue: {
    value: agentlessValue
  }
  forwarderEffect: {
    value: forwarderEffect
  }
  platformFeedEffect: {
    value: platformFeedEffect
  }
  platformFeedRoleEffect: {
    value: roleEffects[platformFeedEffect]
  }
}
// What remediation deploys with (the union of the definitions' roleDefinitionIds), each where it is needed.
var roles = {
  virtualMachineContributor: '9980e02c-c2be-4d73-94e8-173b1dc7cf3c' // Virtual Machine Contributor
  managedIdentityOperator: 'f1a07417-d97a-45cb-824c-7a7467783830' // Managed Identity Operator
  rbacAdministrator: 'f58310d9-a9f6-439a-9e8d-f62e7b41a168' // Role Based Access Control Administrator
}
// The two roles remediation grants (Storage Queue Data Message Processor to a VM on its own queue,
// Scheduled Events Contributor to central at an owner): the RBAC administrator role may grant only them.
var grantable = '8a0f0c08-91a1-4084-bc3d-661d67233fed, b67fe603-310e-4889-b9ee-8257d09d353d'
var grantCondition = '((!(ActionMatches{\'Microsoft.Authorization/roleAssignments/write\'})) OR (@Request[Microsoft.Authorization/roleAssignments:RoleDefinitionId] ForAnyOfAnyValues:GuidEquals {${grantable}})) AND ((!(ActionMatches{\'Microsoft.Authorization/roleAssignments/delete\'})) OR (@Resource[Microsoft.Authorization/roleAssignments:RoleDefinitionId] ForAnyOfAnyValues:GuidEquals {${grantable}}))'

resource definitions 'Microsoft.Authorization/policyDefinitions@2025-03-01' = [for item in items(bodies): {
  name: 'se-${item.key}'
  properties: union(item.value, {
    policyType: 'Custom'
  })
}]

resource initiativeSet 'Microsoft.Authorization/policySetDefinitions@2025-03-01' = {
  name: 'se-coverage'
  dependsOn: [
    definitions
  ]
  properties: {
    policyType: 'Custom'
    displayName: initiative.displayName
    description: initiative.description
    metadata: initiative.metadata
    parameters: initiative.parameters
    policyDefinitions: [for ref in initiative.policyDefinitions: {
      policyDefinitionReferenceId: ref.policyDefinitionReferenceId
      policyDefinitionId: subscriptionResourceId('Microsoft.Authorization/policyDefinitions', 'se-${ref.definition}')
      parameters: ref.parameters
    }]
  }
}

resource assignment 'Microsoft.Authorization/policyAssignments@2025-03-01' = {
  name: assignmentName
  location: location
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    displayName: initiative.displayName
    policyDefinitionId: initiativeSet.id
    enforcementMode: 'Default'
    parameters: assignmentParameters
    nonComplianceMessages: [
      {
        message: 'This VM has neither the Scheduled Events forwarder nor the platform feed: Azure may reboot it at NotBefore with nobody told (docs/deploy.md, "Cover a whole subscription").'
      }
    ]
  }
}

resource remediationRoles 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in items(roles): {
  name: guid(subscription().id, assignment.id, role.value)
  properties: {
    principalId: assignment.identity.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role.value)
    condition: role.key == 'rbacAdministrator' ? grantCondition : null
    conditionVersion: role.key == 'rbacAdministrator' ? '2.0' : null
  }
}]

module storageAccess 'storage-access.bicep' = {
  name: 'se-coverage-storage-${uniqueString(subscription().id, assignmentName)}'
  scope: resourceGroup(split(storageAccountId, '/')[2], split(storageAccountId, '/')[4])
  params: {
    storageAccountName: last(split(storageAccountId, '/'))
    principalId: assignment.identity.principalId
  }
}

output ASSIGNMENT_ID string = assignment.id
output ASSIGNMENT_PRINCIPAL_ID string = assignment.identity.principalId
output REFERENCE_IDS array = [for ref in initiative.policyDefinitions: ref.policyDefinitionReferenceId]
