// A storage account of its own for one blob container that the Function app must not be able to change.
// The Function app holds Storage Blob Data Owner on the pipeline's account (host storage, stse*), which
// reaches every container there. Two containers live apart for that reason (main.bicep):
// - the forwarder artifacts (wheelhouse bundles, install scripts) that the VMs download and run as
//   root/SYSTEM: only the VMs' identity reads them, operators upload;
// - Event Hubs Capture's archive (when Capture is on): Capture's identity writes, analysts read, and the
//   Function app cannot delete or rewrite the record.
@description('Azure region.')
param location string

@description('Tags put on every resource.')
param tags object

@description('Storage account name (3-24 lowercase letters and digits).')
@minLength(3)
@maxLength(24)
param storageAccountName string

@description('The blob container.')
param containerName string

@description('Enabled or Disabled: public network access to the account.')
@allowed([
  'Enabled'
  'Disabled'
])
param publicNetworkAccess string

@description('Storage redundancy SKU.')
param skuName string

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_35: the VMs download the bundle (and Event Hubs Capture writes, analysts read) from any network they sit on (no private endpoint assumed); every request needs an Entra token (shared keys off, public blob access off).
  // checkov:skip=CKV_AZURE_206: redundancy is the parameter storageSkuName (by default Standard_ZRS where the region has it, else Standard_LRS); the bundles are rebuilt from the repository (make wheelhouse) if lost, and Capture's files are a copy of the hub's stream. checkov cannot resolve a parameter here.
  // checkov:skip=CKV_AZURE_43: the name is a parameter checkov cannot resolve; main.bicep builds it as 'stsea' or 'stsec' + uniqueString (lowercase letters and digits, 18 characters).
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
      }
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: account
  name: 'default'
  properties: {
    // Versioning keeps every blob written: an overwritten or deleted one can be recovered/audited.
    isVersioningEnabled: true
    deleteRetentionPolicy: {
      enabled: true
      days: 30
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 30
    }
  }
}

resource container 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: containerName
  properties: {
    publicAccess: 'None'
  }
}

output accountId string = account.id
output accountName string = account.name
output containerUrl string = '${account.properties.primaryEndpoints.blob}${container.name}'
