// Key Vault for the alert webhook URL (it carries a token for Teams/Slack, so it is a secret):
// RBAC authorization (no access policies), soft delete and purge protection on. The Function app
// reads it through a Key Vault reference with its user-assigned identity (Key Vault Secrets User
// on that one secret, granted in roles.bicep).
@description('Azure region.')
param location string

@description('Tags put on every resource.')
param tags object

@description('Key Vault name (3-24 characters).')
@minLength(3)
@maxLength(24)
param keyVaultName string

@description('Enabled or Disabled: public network access to the vault.')
@allowed([
  'Enabled'
  'Disabled'
])
param publicNetworkAccess string

@description('Name of the secret holding the alert webhook URL.')
param webhookSecretName string

@secure()
@description('The alert webhook URL; empty: no secret is created and alerts are only logged.')
param alertWebhookUrl string

@description('Unix time (seconds) when the webhook secret expires.')
param webhookSecretExpiry int

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  // checkov:skip=CKV_AZURE_109: the Flex Consumption app resolves its Key Vault reference over the public endpoint (no VNet integration in this template); a firewall default Deny would break it. Access is RBAC-only, to one secret, for one identity; set keyVaultPublicNetworkAccess=Disabled once you add VNet integration and a private endpoint.
  // checkov:skip=CKV_AZURE_189: same reason as CKV_AZURE_109: public network access is the parameter keyVaultPublicNetworkAccess (Enabled by default because the app has no private network path here).
  name: keyVaultName
  location: location
  tags: tags
  properties: {
    tenantId: tenant().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 90
    enablePurgeProtection: true
    enabledForDeployment: false
    enabledForDiskEncryption: false
    enabledForTemplateDeployment: false
    publicNetworkAccess: publicNetworkAccess
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
  }
}

resource webhookSecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(alertWebhookUrl)) {
  // checkov:skip=CKV_AZURE_41: checkov reads no properties of a conditional (if) resource; the expiry IS set below (attributes.exp, one year after deployment).
  // checkov:skip=CKV_AZURE_114: checkov reads no properties of a conditional (if) resource; contentType IS set below ('text/uri').
  parent: vault
  name: webhookSecretName
  properties: {
    value: alertWebhookUrl
    contentType: 'text/uri'
    attributes: {
      enabled: true
      exp: webhookSecretExpiry
    }
  }
}

output vaultId string = vault.id
output vaultName string = vault.name
// No output reads alertWebhookUrl (a secure parameter): main.bicep derives the secret's URI itself.
output vaultUri string = vault.properties.vaultUri
