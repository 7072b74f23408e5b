"""AzureWebJobsStorage, the host's own storage account: Event Hubs checkpoints and singleton locks."""

from __future__ import annotations

from typing import Any, Dict

from .settings import AppSettings, Connection, SettingsError


def credential_for(section: Dict[str, str]) -> Any:
    """The identity an identity-based connection names (`credential`=managedidentity, `clientId`)."""
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

    if section.get("credential", "").lower() == "managedidentity":
        return ManagedIdentityCredential(client_id=section.get("clientId") or None)
    return DefaultAzureCredential()


def webjobs_storage(settings: AppSettings, needed_by: str) -> Connection:
    """The AzureWebJobsStorage connection; `needed_by` names what needs it, for the error."""
    try:
        return settings.connection("AzureWebJobsStorage")
    except SettingsError:
        raise SettingsError(f"{needed_by} need AzureWebJobsStorage: define it") from None


def blob_service_url(storage: Connection) -> str:
    """An identity-based AzureWebJobsStorage's blob endpoint (`__blobServiceUri` or `__accountName`)."""
    url = storage.section.get("blobServiceUri") or (
        f"https://{storage.section['accountName']}.blob.core.windows.net"
        if "accountName" in storage.section
        else None
    )
    if not url:
        raise SettingsError("AzureWebJobsStorage__blobServiceUri or __accountName is needed")
    return url


def webjobs_container(settings: AppSettings, name: str, needed_by: str, create: bool = True) -> Any:
    """A blob container of AzureWebJobsStorage, created if missing (`create`: now; else the caller
    creates it when it first finds it missing)."""
    from azure.storage.blob import ContainerClient

    storage = webjobs_storage(settings, needed_by)
    if storage.connection_string:
        container = ContainerClient.from_connection_string(storage.connection_string, name)
    else:
        credential = credential_for(storage.section)
        container = ContainerClient(blob_service_url(storage), name, credential=credential)
    from azure.core.exceptions import ResourceExistsError

    if create and not container.exists():
        try:
            container.create_container()
        except ResourceExistsError:  # another instance, starting at the same time
            pass
    return container
