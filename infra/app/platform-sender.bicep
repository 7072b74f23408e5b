// Azure Event Hubs Data Sender for the platform feed's system topic identity, scoped to the platform hub
// alone (issue 23): no other hub, not the namespace, so the topic can deliver there and nowhere else.
// Deployed by platform-feed.bicep into the hub's resource group.
@description('Resource id of the platform hub (Microsoft.EventHub/namespaces/eventhubs).')
param platformHubId string

@description('Resource id of the system topic (part of the role assignment\'s stable name).')
param topicId string

@description('Principal id of the system topic\'s system-assigned identity.')
param topicPrincipalId string

var eventHubsDataSender = '2b629674-e913-4c01-ae53-ef4638d8f975' // Azure Event Hubs Data Sender

resource namespace 'Microsoft.EventHub/namespaces@2024-01-01' existing = {
  name: split(platformHubId, '/')[8]
}

resource platformHub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' existing = {
  parent: namespace
  name: last(split(platformHubId, '/'))
}

resource topicSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(platformHub.id, topicId, eventHubsDataSender)
  scope: platformHub
  properties: {
    principalId: topicPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', eventHubsDataSender)
  }
}

output roleAssignmentId string = topicSender.id
