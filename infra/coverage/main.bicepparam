// Parameters of infra/coverage/main.bicep: infra/main.bicep's outputs, from the environment
// (`azd env get-values` prints them; export them, or run after `azd up` in the same shell: docs/deploy.md).
using './main.bicep'

param location = readEnvironmentVariable('AZURE_LOCATION')
param artifactsUrl = readEnvironmentVariable('FORWARDER_ARTIFACTS_URL')
param eventHubNamespace = readEnvironmentVariable('EVENTHUB_NAMESPACE')
param eventHubName = readEnvironmentVariable('EVENTHUB_NAME')
param vmIdentityId = readEnvironmentVariable('VM_IDENTITY_ID')
param vmIdentityClientId = readEnvironmentVariable('VM_IDENTITY_CLIENT_ID')
param queueServiceUri = readEnvironmentVariable('QUEUE_SERVICE_URI', '')
param storageAccountId = readEnvironmentVariable('STORAGE_ACCOUNT_ID')
param centralPrincipalId = readEnvironmentVariable('FUNCTION_PRINCIPAL_ID')
param exclusionTagName = readEnvironmentVariable('SE_COVERAGE_TAG', 'se-forwarder')
param forwarderEffect = readEnvironmentVariable('SE_COVERAGE_FORWARDER_EFFECT', 'DeployIfNotExists')
param platformFeedEffect = readEnvironmentVariable('SE_COVERAGE_PLATFORM_FEED_EFFECT', 'Modify')
