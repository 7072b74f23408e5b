// Parameters of infra/main.bicep. azd and `az deployment sub create -p` both read this file.
// Values from the environment: azd sets AZURE_ENV_NAME and AZURE_LOCATION; set SE_ALERT_EMAIL (required:
// the build stops with an error naming it when unset) and, optionally, SE_ALERT_WEBHOOK_URL,
// SE_AUTHN_MODE, SE_AUTHN_TRUST_PEM, SE_KEY_VAULT_SUFFIX, SE_POLICY_JSON and SE_POLICY_SHADOW_JSON (a candidate policy
// to rehearse: its verdicts are recorded, never sent), and SE_PLATFORM_* (the platform feed, below).
// The policy is the file infra/policy.json (checked by `se-policy check` before every provision: azd's
// preprovision hook, the az steps in docs/deploy.md); SE_POLICY_JSON, when set, replaces it.
using './main.bicep'

param environmentName = readEnvironmentVariable('AZURE_ENV_NAME', 'scheduled-events')
param location = readEnvironmentVariable('AZURE_LOCATION')
param alertEmailAddress = readEnvironmentVariable('SE_ALERT_EMAIL')
param alertWebhookUrl = readEnvironmentVariable('SE_ALERT_WEBHOOK_URL', '')
param alertWebhookFormat = 'generic'
// Set by infra/hooks/operator-app.sh (azd preprovision), or by you: the operator API's app registration.
param operatorApiClientId = readEnvironmentVariable('SE_OPERATOR_API_CLIENT_ID')
param operatorKeySha256 = readEnvironmentVariable('SE_OPERATOR_KEY_SHA256', '')
param policyJson = empty(readEnvironmentVariable('SE_POLICY_JSON', '')) ? loadTextContent('policy.json') : readEnvironmentVariable('SE_POLICY_JSON', '')
param policyShadowJson = readEnvironmentVariable('SE_POLICY_SHADOW_JSON', '')
param keyVaultNameSuffix = readEnvironmentVariable('SE_KEY_VAULT_SUFFIX', '')
param authnTrustPem = readEnvironmentVariable('SE_AUTHN_TRUST_PEM', '')
// required unless SE_AUTHN_MODE says otherwise (preferred while a fleet's forwarders are upgraded)
param authnMode = readEnvironmentVariable('SE_AUTHN_MODE', 'required')
param eventHubPartitionCount = 4
param captureEnabled = false
param eventHubsPublicNetworkAccess = 'Enabled'
param heartbeatMissingMinutes = 15
param tags = {
  workload: 'scheduled-events'
}
// The platform feed (issue 23): preview in Azure, so off unless SE_PLATFORM_FEED=true (docs/deploy.md, "The
// platform feed": two feature registrations and the deployer's subscriber role first).
param platformFeedEnabled = toLower(readEnvironmentVariable('SE_PLATFORM_FEED', 'false')) == 'true'
param platformSystemTopicName = readEnvironmentVariable('SE_PLATFORM_SYSTEM_TOPIC', '')
param platformSystemTopicResourceGroup = readEnvironmentVariable('SE_PLATFORM_SYSTEM_TOPIC_RG', '')
param platformConfirmScopes = readEnvironmentVariable('SE_PLATFORM_CONFIRM_SCOPES', '')
param coverageScopes = readEnvironmentVariable('SE_COVERAGE_SCOPES', '')
param coverageTag = readEnvironmentVariable('SE_COVERAGE_TAG', 'se-forwarder')
