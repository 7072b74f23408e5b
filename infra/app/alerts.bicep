// Azure Monitor alerts on the pipeline's own health, all log queries over the Log Analytics workspace
// that Application Insights writes to (tables AppRequests, AppTraces), sent to one action group (email).
// What each reads is in docs/deploy.md; the log markers are a contract with the central package.
@description('Azure region of the alert rules.')
param location string

@description('Tags put on every resource.')
param tags object

@description('Action group name.')
param actionGroupName string

@description('Short name of the action group (at most 12 characters; shown in SMS/email).')
@maxLength(12)
param actionGroupShortName string

@description('Email address that receives the alerts.')
param alertEmailAddress string

@description('Resource id of the Log Analytics workspace.')
param workspaceId string

@description('Name of the Function app (its invocations are AppRequests rows with this AppRoleName).')
param functionAppName string

@description('Minutes without a heartbeat after which a forwarder counts as missing.')
@minValue(5)
@maxValue(1440)
param heartbeatMissingMinutes int

@description('Log line marker the central package writes for each forwarder heartbeat it processes.')
param heartbeatLogMarker string

@description('Log line marker the central package writes when a heartbeat reports outbox drops.')
param outboxDropLogMarker string

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = {
  name: actionGroupName
  location: 'global'
  tags: tags
  properties: {
    groupShortName: actionGroupShortName
    enabled: true
    emailReceivers: [
      {
        name: 'operators'
        emailAddress: alertEmailAddress
        useCommonAlertSchema: true
      }
    ]
  }
}

// Failed function invocations (Event Hubs trigger, timer, HTTP) in the last 15 minutes.
var functionFailuresQuery = '''
AppRequests
| where AppRoleName =~ '{app}'
| where Success == false
| project TimeGenerated, OperationName, ResultCode
'''

// Forwarders that sent a heartbeat in the last day but none in the last N minutes (one marker line
// names up to 100 VMs: each vmId in it is a row). A VM deleted on
// purpose stops alerting after a day; a VM that never sent one is not known here (see docs).
var heartbeatsMissingQuery = '''
AppTraces
| where TimeGenerated > ago(1d)
| where Message has '{marker}'
| mv-expand vmId = extract_all(@'vmId=([0-9A-Za-z-]+)', Message) to typeof(string)
| where isnotempty(vmId)
| summarize lastSeen = max(TimeGenerated) by vmId
| where lastSeen < ago({minutes}m) and lastSeen > ago({minutes}m + 1h)
'''

// Heartbeats that report envelopes the forwarder's bounded outbox had to drop.
var outboxDropsQuery = '''
AppTraces
| where Message has '{marker}'
| extend vmId = extract(@'vmId=([0-9A-Za-z-]+)', 1, Message), dropped = toint(extract(@'dropped=([0-9]+)', 1, Message))
| where dropped > 0
'''

resource functionFailures 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: 'se-function-failures'
  location: location
  tags: tags
  properties: {
    displayName: 'Scheduled events: function failures'
    description: 'A function invocation of the central app failed in the last 15 minutes.'
    severity: 1
    enabled: true
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    scopes: [
      workspaceId
    ]
    criteria: {
      allOf: [
        {
          query: replace(functionFailuresQuery, '{app}', functionAppName)
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
}

resource heartbeatsMissing 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: 'se-forwarder-heartbeats-missing'
  location: location
  tags: tags
  properties: {
    displayName: 'Scheduled events: forwarder heartbeats missing'
    description: 'Forwarders went silent: no heartbeat for ${heartbeatMissingMinutes} minutes (one alert for all of them; the results list each vmId).'
    severity: 2
    enabled: true
    evaluationFrequency: 'PT15M'
    windowSize: 'P1D'
    scopes: [
      workspaceId
    ]
    criteria: {
      allOf: [
        {
          query: replace(replace(heartbeatsMissingQuery, '{marker}', heartbeatLogMarker), '{minutes}', string(heartbeatMissingMinutes))
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          // one alert for the VMs that went silent, not one per VM: an outage of central or the hub (every
          // VM silent at once) pages once, and each scale-in, eviction or Terminate the fleet handles ends
          // one VM's heartbeats. Only VMs silent for less than an hour past the window count, so a VM that
          // left the fleet resolves the alert within the hour instead of keeping it fired for a day.
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
}

resource outboxDrops 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: 'se-forwarder-outbox-drops'
  location: location
  tags: tags
  properties: {
    displayName: 'Scheduled events: forwarder outbox drops reported'
    description: 'A forwarder reported envelopes dropped from its full outbox (the hub was unreachable too long).'
    severity: 1
    enabled: true
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    scopes: [
      workspaceId
    ]
    criteria: {
      allOf: [
        {
          query: replace(outboxDropsQuery, '{marker}', outboxDropLogMarker)
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          dimensions: [
            {
              name: 'vmId'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: false
    actions: {
      actionGroups: [
        actionGroup.id
      ]
    }
  }
}

output actionGroupId string = actionGroup.id
output alertRuleIds array = [
  functionFailures.id
  heartbeatsMissing.id
  outboxDrops.id
]
