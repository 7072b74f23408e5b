// One storage account: the Functions host (blobs: leases, Event Hubs checkpoints), the Flex deployment
// package, the approval queues (one per VM, created by the central package) and the log store (tables).
// The forwarder artifacts and Capture's archive live in accounts of their own (sealed-storage.bicep): the
// Function app's Blob Data Owner here reaches every container of this account.
// Shared key access is off: every caller authenticates with Entra ID (managed identity).
@description('Azure region.')
param location string

@description('Tags put on every resource.')
param tags object

@description('Storage account name (3-24 lowercase letters and digits).')
@minLength(3)
@maxLength(24)
param storageAccountName string

@description('Blob container for the Flex Consumption deployment package.')
param deploymentContainerName string

@description('Enabled or Disabled: public network access to the account.')
@allowed([
  'Enabled'
  'Disabled'
])
param publicNetworkAccess string

@description('Storage redundancy SKU.')
param skuName string

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_35: Flex Consumption without VNet integration reaches its host storage, deployment package, queues and tables over the public endpoint, and the VMs' forwarders reach their approval queues from any network; a default Deny would cut both. Every request needs an Entra token (shared keys off); storagePublicNetworkAccess=Disabled is the switch once private endpoints exist.
  // checkov:skip=CKV_AZURE_206: redundancy is the parameter storageSkuName (by default per region: Standard_ZRS where the region has zone-redundant storage, else Standard_LRS; Standard_GZRS for geo-replication). checkov cannot resolve a parameter here.
  // checkov:skip=CKV_AZURE_43: the name is a parameter checkov cannot resolve; main.bicep builds it as 'stse' + uniqueString (lowercase letters and digits, 17 characters) and @minLength/@maxLength bound it.
  name: storageAccountName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: skuName
  }
  properties: {
    accessTier: 'Hot'
    allowSharedKeyAccess: false
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: publicNetworkAccess
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
      services: {
        blob: {
          enabled: true
          keyType: 'Account'
        }
        file: {
          enabled: true
          keyType: 'Account'
        }
        queue: {
          enabled: true
          keyType: 'Account'
        }
        table: {
          enabled: true
          keyType: 'Account'
        }
      }
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: account
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

// Approval queues are created per VM at run time by the central package (names derive from vmId).
resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: account
  name: 'default'
}

output accountId string = account.id
output accountName string = account.name
output blobEndpoint string = account.properties.primaryEndpoints.blob
output queueEndpoint string = account.properties.primaryEndpoints.queue
output tableEndpoint string = account.properties.primaryEndpoints.table
output deploymentContainerUrl string = '${account.properties.primaryEndpoints.blob}${deploymentContainer.name}'
