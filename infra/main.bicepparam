// Parameters of infra/main.bicep. azd and `az deployment sub create -p` both read this file.
// Values from the environment: azd sets AZURE_ENV_NAME and AZURE_LOCATION; set the others yourself.
using './main.bicep'

param environmentName = readEnvironmentVariable('AZURE_ENV_NAME', 'scheduled-events')
param location = readEnvironmentVariable('AZURE_LOCATION', 'westeurope')
param alertEmailAddress = readEnvironmentVariable('SE_ALERT_EMAIL', 'ops@example.com')
param alertWebhookUrl = readEnvironmentVariable('SE_ALERT_WEBHOOK_URL', '')
param alertWebhookFormat = 'generic'
param policyJson = readEnvironmentVariable('SE_POLICY_JSON', '')
param eventHubPartitionCount = 4
param captureEnabled = false
param eventHubsPublicNetworkAccess = 'Enabled'
param heartbeatMissingMinutes = 15
param tags = {
  workload: 'scheduled-events'
}
