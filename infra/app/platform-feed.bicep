// The platform's own Scheduled Events feed (issue 23; docs/deploy.md, "The platform feed"): the
// subscription's Event Grid system topic of type Microsoft.ResourceNotifications.MaintenanceResources
// delivers ScheduledEventEmitted events to the pipeline's platform hub, authenticated with the topic's
// system-assigned identity (deliveryWithResourceIdentity: no key, no SAS). That identity gets Azure Event
// Hubs Data Sender on the platform hub and nothing else (platform-sender.bicep), so only Azure speaks there.
// Deployed into the topic's resource group. Azure allows one system topic per source (the subscription):
// with existingTopicName the topic is not created; only this pipeline's event subscription is added to it
// (the existing topic needs a system-assigned identity: docs/deploy.md).
// PREVIEW in Azure: main.bicep deploys this only when platformFeedEnabled is true (default false).
@description('Name of the subscription\'s existing MaintenanceResources system topic (in this resource group); empty: create one named newTopicName.')
param existingTopicName string

@maxLength(128)
@description('Name of the system topic created when existingTopicName is empty.')
param newTopicName string

@maxLength(64)
@description('Name of this pipeline\'s event subscription on the topic (one per environment: every one gets every event of the subscription).')
param eventSubscriptionName string

@description('Resource id of the platform hub (Microsoft.EventHub/namespaces/eventhubs) the events are delivered to.')
param platformHubId string

@description('Tags put on the created topic.')
param tags object

var createTopic = empty(existingTopicName)
var topicName = createTopic ? newTopicName : existingTopicName
// The one event type central reads (central/intake/platform.py EMITTED); anything else would be quarantined.
var emittedType = 'Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted'

// Subscription-wide events live in a resource group with location global (Event Grid's system-topic docs).
resource newTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' = if (createTopic) {
  name: newTopicName
  location: 'global'
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: subscription().id
    topicType: 'Microsoft.ResourceNotifications.MaintenanceResources'
  }
}

// The topic by name, created above or already there: the event subscription's parent and, for an existing
// topic, its identity (ARM's if() evaluates only the branch taken, so it is read only when it existed).
resource topic 'Microsoft.EventGrid/systemTopics@2025-02-15' existing = {
  name: topicName
}

// Data Sender on the platform hub only, in the hub's resource group; before the subscription delivers.
module sender 'platform-sender.bicep' = {
  name: 'se-platform-sender-${uniqueString(platformHubId, topicName)}'
  scope: resourceGroup(split(platformHubId, '/')[2], split(platformHubId, '/')[4])
  params: {
    platformHubId: platformHubId
    topicId: topic.id
    topicPrincipalId: createTopic ? newTopic!.identity.principalId : topic.identity.principalId
  }
}

resource toPlatformHub 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = {
  parent: topic
  name: eventSubscriptionName
  dependsOn: [
    sender
  ]
  properties: {
    deliveryWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      destination: {
        endpointType: 'EventHub'
        properties: {
          resourceId: platformHubId
          // All states of one event on one partition (data.resourceInfo.name is the EventId): one instance
          // of central sees them, fewer store conflicts. Event Grid still does not order them.
          deliveryAttributeMappings: [
            {
              name: 'PartitionKey'
              type: 'Dynamic'
              properties: {
                sourceField: 'data.resourceInfo.name'
              }
            }
          ]
        }
      }
    }
    filter: {
      includedEventTypes: [
        emittedType
      ]
    }
    // central/intake/platform.py reads the Event Grid schema (and CloudEvents 1.0 alike).
    eventDeliverySchema: 'EventGridSchema'
    // Event Grid's own defaults, stated: 30 attempts within a day, then the event is dropped (an outage of
    // the platform hub longer than that loses platform events; the VMs' own witness still reports them).
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
  }
}

output topicName string = topicName
output topicId string = topic.id
output eventSubscriptionName string = toPlatformHub.name
