// An Azure Monitor workbook over the Log Analytics workspace Application Insights writes to: open events
// with their decision, approvals and their latency, silent VMs, quarantines, alert failures, over a time
// range. Its queries (workbook.json) read the central app's `se.*` log lines (AppTraces) and its
// OpenTelemetry metrics (AppMetrics); tests/infra/test_workbook.py holds their fields to the code.
@description('Azure region of the workbook.')
param location string

@description('Tags put on every resource.')
param tags object

@description('Display name shown in Azure Monitor > Workbooks.')
param displayName string

@description('Resource id of the Log Analytics workspace the queries run against.')
param workspaceId string

@description('Default of the workbook\'s "silent after" parameter, minutes (the heartbeat alert\'s threshold).')
@minValue(5)
@maxValue(1440)
param silentMinutes int

var serializedData = replace(replace(loadTextContent('workbook.json'), '__WORKSPACE_ID__', workspaceId), '__SILENT_MINUTES__', string(silentMinutes))

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  // A workbook's name must be a GUID; this one is stable per resource group, so a redeploy updates it.
  name: guid(resourceGroup().id, 'scheduled-events-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: displayName
    category: 'workbook'
    version: 'Notebook/1.0'
    sourceId: workspaceId
    serializedData: serializedData
  }
}

output workbookId string = workbook.id
