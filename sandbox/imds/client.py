"""A small client for the simulator's admin API and its /metadata routes, for tests, demos and
operators' scripts. Proxies are never used (trust_env=False), as for the real IMDS."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, TypeVar

import requests

T = TypeVar("T")


class SimulatorError(RuntimeError):
    pass


class ImdsSimulator:
    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.trust_env = False  # IMDS is never reached through a proxy

    # ---- /metadata, as a VM sees it ---------------------------------------------------------
    def vm_url(self, vm: Optional[str] = None) -> str:
        """The IMDS base URL a forwarder for `vm` uses (plain base = the first VM)."""
        return f"{self.base_url}/vms/{vm}" if vm else self.base_url

    def metadata(self, method: str, path: str, vm: Optional[str] = None,
                 api_version: Optional[str] = "2020-07-01", headers: Optional[Dict[str, str]] = None,
                 timeout: Optional[float] = None,
                 **kwargs: Any) -> requests.Response:
        params = dict(kwargs.pop("params", {}))
        if api_version is not None:
            params["api-version"] = api_version
        sent = {"Metadata": "true", **(headers or {})}
        return self.session.request(method, f"{self.vm_url(vm)}{path}", params=params, headers=sent,
                                    timeout=timeout or self.timeout, allow_redirects=False, **kwargs)

    def scheduled_events(self, vm: Optional[str] = None, api_version: str = "2020-07-01") -> Dict[str, Any]:
        response = self.metadata("GET", "/metadata/scheduledevents", vm, api_version)
        if response.status_code != 200:
            raise SimulatorError(f"GET scheduledevents: {response.status_code} {response.text}")
        return response.json()

    def approve(self, event_ids: List[str], vm: Optional[str] = None) -> requests.Response:
        body = {"StartRequests": [{"EventId": i} for i in event_ids]}
        return self.metadata("POST", "/metadata/scheduledevents", vm, json=body)

    # ---- admin ------------------------------------------------------------------------------
    def admin(self, method: str, path: str, expect: int = 200, **kwargs: Any) -> Any:
        url = f"{self.base_url}/admin{path}"
        response = self.session.request(method, url, timeout=self.timeout, **kwargs)
        if response.status_code != expect:
            raise SimulatorError(f"{method} /admin{path}: {response.status_code} {response.text}")
        return response.json()

    def add_event(self, **spec: Any) -> Dict[str, Any]:
        return self.admin("POST", "/events", 201, json=spec)

    def events(self) -> List[Dict[str, Any]]:
        return self.admin("GET", "/events")

    def event(self, event_id: str) -> Dict[str, Any]:
        return self.admin("GET", f"/events/{event_id}")

    def cancel(self, event_id: str) -> Dict[str, Any]:
        return self.admin("POST", f"/events/{event_id}/cancel")

    def add_vm(self, **spec: Any) -> Dict[str, Any]:
        return self.admin("POST", "/vms", 201, json=spec)

    def document(self, vm: str, api_version: str = "2020-07-01") -> Dict[str, Any]:
        """The VM's document without rate limit, faults or request log."""
        return self.admin("GET", f"/vms/{vm}/document", params={"api-version": api_version})

    def fault(self, **spec: Any) -> Dict[str, Any]:
        return self.admin("POST", "/faults", 201, json=spec)

    def clear_faults(self) -> None:
        self.admin("DELETE", "/faults")

    def requests(self, vm: Optional[str] = None, method: Optional[str] = None,
                 path: Optional[str] = None) -> List[Dict[str, Any]]:
        params = {k: v for k, v in (("vm", vm), ("method", method), ("path", path)) if v}
        return self.admin("GET", "/requests", params=params)

    def reset(self) -> None:
        self.admin("POST", "/reset")

    def close(self) -> None:
        self.session.close()


def wait_for(check: Callable[[], Optional[T]], timeout: float = 10.0, interval: float = 0.05) -> T:
    """Poll `check` until it returns something truthy; bounded in time (raises TimeoutError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)
