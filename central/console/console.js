/* The on-call console: signs in with @azure/msal-browser (auth code + PKCE), reads the operator API
   (/api/events/pending, /api/fleet, /api/events/{id}) with the signed-in person's token, and lets an
   Operator approve, hold or release with a reason. Views by URL hash: #pending, #fleet, #event=<id>. */
"use strict";
(function () {
  const { el, when, countdown, ago, list } = window.SE;
  const REFRESH_MS = 15000;
  const $ = (id) => document.getElementById(id);
  const state = { config: null, app: null, account: null, roles: [], fetchedAt: null, expired: false,
                  current: null, busy: false };

  function notice(text, withSignIn) {
    const box = $("notice");
    box.replaceChildren(text ? el("span", {}, text) : "");
    if (withSignIn) {
      const again = el("button", { type: "button", class: "primary" }, "Sign in again");
      again.addEventListener("click", signIn);
      box.append(" ", again);
    }
  }

  function isOperator() { return state.roles.includes("Operator"); }

  async function signIn() {
    await state.app.loginRedirect({ scopes: state.config.scopes, redirectStartPage: location.href });
  }

  async function signOut() {
    await state.app.logoutRedirect({ account: state.account });
  }

  function expire(text) {
    state.expired = true;
    notice(text || "Your session has expired: sign in again to see fresh data and decide.", true);
    $("signin").hidden = false;
  }

  async function token() {
    try {
      const result = await state.app.acquireTokenSilent({ scopes: state.config.scopes, account: state.account,
        cacheLookupPolicy: msal.CacheLookupPolicy.AccessToken });
      return result.accessToken;
    } catch (e) {
      expire();
      return null;
    }
  }

  /** GET or POST the operator API; null (and a notice) when the session or the call failed. */
  async function api(path, body) {
    const bearer = await token();
    if (!bearer) return null;
    const init = { headers: { Authorization: "Bearer " + bearer }, cache: "no-store" };
    if (body) {
      init.method = "POST";
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const resp = await fetch("/api/" + path, init);
    let document_ = null;
    try { document_ = await resp.json(); } catch (e) { document_ = { error: resp.statusText }; }
    if (resp.status === 401) { expire(); return null; }
    if (!resp.ok) throw new Error((document_ && document_.error) || ("HTTP " + resp.status));
    return document_;
  }

  // ---- views ---------------------------------------------------------------------------------
  function route() {
    const hash = decodeURIComponent(location.hash.replace(/^#/, ""));
    if (hash.startsWith("event=")) return { view: "event", id: hash.slice("event=".length) };
    return { view: hash === "fleet" ? "fleet" : "pending" };
  }

  function eventLink(id, label) { return el("a", { href: "#event=" + encodeURIComponent(id) }, label || id); }

  function carriedBy(ev) {
    const d = ev.decision || {};
    if (d.via === "arm") return "ARM (Microsoft.Maintenance acknowledge, by central; no VM involved)";
    if (String(d.action || "").includes("hook")) {
      return "the VM's pre-approval hook (e.g. a drain), then its forwarder" +
        (d.leaderVmName ? " on " + d.leaderVmName : "");
    }
    if (d.leaderVmName) return "the forwarder on " + d.leaderVmName;
    return "nothing sent yet (an approval goes to an elected VM's forwarder, or through ARM)";
  }

  function why(ev) {
    const d = ev.decision;
    if (!d) return "no decision yet";
    return (d.rule ? "rule " + d.rule + ": " : "") + (d.reason || d.action || "");
  }

  function actions(ev) {
    if (!isOperator() || ev.endedAt || ev.status === "Completed") return null;
    const box = el("div", { class: "actions" });
    const choices = [["approve", "Approve…"], ["hold", "Hold…"]];
    if (ev.operatorHold) choices.push(["release", "Release…"]);
    for (const [action, label] of choices) {
      const button = el("button", { type: "button", "data-action": action }, label);
      button.addEventListener("click", () => confirmDecision(ev, action));
      box.append(button);
    }
    return box;
  }

  function facts(pairs) {
    return el("dl", {}, pairs.filter(Boolean).map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  }

  function notBefore(ev) {
    return el("span", {}, when(ev.notBefore), " (",
      el("span", { "data-notbefore": ev.notBefore || "" }, countdown(ev.notBefore, new Date())), ")");
  }

  function pendingView(events) {
    const out = [el("h1", {}, "Pending events (" + events.length + ")")];
    if (!events.length) out.push(el("p", { class: "muted" }, "Nothing is pending."));
    for (const ev of events) {
      out.push(el("article", { class: "card", "data-event": ev.eventId },
        el("h2", {}, ev.eventType + " on " + list(ev.resources)),
        facts([
          ["Event", eventLink(ev.eventId)],
          ["NotBefore", notBefore(ev)],
          ["State", el("span", { class: "state" }, ev.state + " (" + ev.status + ")" +
            (ev.operatorHold ? ", held by an operator" : ""))],
          ["Why", el("span", { class: "why" }, why(ev))],
          ["Approval carried by", carriedBy(ev)],
        ]),
        actions(ev)));
    }
    return out;
  }

  function coverage(vm) {
    if (vm.forwarderVersion) return "forwarder " + vm.forwarderVersion;
    return "platform feed only (no forwarder heard)";
  }

  function fleetView(fleet) {
    const rows = fleet.vms.map((vm) => el("tr", {},
      el("td", {}, vm.name || vm.vmId),
      el("td", {}, el("span", { class: vm.silent ? "silent" : "live" }, vm.silent ? "silent" : "live")),
      el("td", {}, vm.lastSeen ? ago(new Date() - new Date(vm.lastSeen)) : "never"),
      el("td", {}, coverage(vm)),
      el("td", {}, list(vm.groups)),
      el("td", {}, vm.openEvents.length ? vm.openEvents.map((id, i) =>
        [i ? ", " : "", eventLink(id, id.slice(0, 8) + " (" + (vm.openEventStates[id] || "?") + ")")]) : "-")));
    return [
      el("h1", {}, "Fleet: " + fleet.knownVms + " VMs, " + fleet.silentVms + " silent"),
      el("p", { class: "muted" }, "Silent VMs first (nothing heard for " + fleet.livenessSeconds +
        " s). Sender authentication: " + fleet.authnMode + "."),
      el("table", {},
        el("caption", { class: "muted" }, "Every VM central knows"),
        el("thead", {}, el("tr", {}, ["VM", "Heard", "Last heard", "Covered by", "Budget groups", "Open events"]
          .map((h) => el("th", { scope: "col" }, h)))),
        el("tbody", {}, rows)),
    ];
  }

  function storyView(ev) {
    const reports = Object.entries(ev.reportedBy || {}).map(([vm, vmId]) =>
      el("li", {}, "VM " + vm + " (its forwarder; vmId " + vmId + ")"));
    const platform = ev.witnesses && ev.witnesses.platform;
    if (platform) {
      reports.push(el("li", {}, "Azure's own feed (Event Grid): " + Object.entries(platform)
        .map(([k, v]) => k + " " + (typeof v === "object" ? JSON.stringify(v) : v)).join(", ")));
    }
    const decisions = (ev.decisions || []).map((d) => el("li", {},
      when(d.at) + ": " + d.action + " → " + d.state + (d.shadow ? " (shadow policy, not sent)" : "") +
      ", by " + (d.decidedBy || "?") + (d.rule ? ", rule " + d.rule : "") + (d.reason ? ": " + d.reason : "") +
      (d.leaderVmName ? "; sent to " + d.leaderVmName : "")));
    const approvals = (ev.approvals || []).map((a) => el("li", {},
      "Attempt " + (a.attempt || "?") + ": " + (a.action || "approve") + " to " + (a.vmName || a.via || "?") +
      (a.sentAt ? ", sent " + when(a.sentAt) : "") + (a.expiresAt ? ", expires " + when(a.expiresAt) : "") +
      ", by " + (a.decidedBy || "?") + "; result: " + (a.result ? (typeof a.result === "object" ?
        JSON.stringify(a.result) : a.result) + (a.resultAt ? " at " + when(a.resultAt) : "") :
        (a.sent ? "none yet" : "not sent"))));
    const alerts = (ev.alerts || []).map((a) => el("li", {}, when(a.at) + ": [" + a.severity + "] " + a.title +
      " (" + (a.outcome || "not known") + ")"));
    const section = (title, items, empty) => [el("h2", {}, title),
      items.length ? el("ol", { class: "story" }, items) : el("p", { class: "muted" }, empty)];
    return [
      el("h1", {}, ev.eventType + " on " + list(ev.resources)),
      facts([
        ["Event", el("code", {}, ev.eventId)],
        ["State", ev.state + " (" + ev.status + ")" + (ev.operatorHold ? ", held by an operator" : "")],
        ["NotBefore", notBefore(ev)],
        ["Source", ev.eventSource || "-"],
        ["Description", ev.description || "-"],
        ["First seen", when(ev.firstSeen)],
        ["Why", why(ev)],
        ["Approval carried by", carriedBy(ev)],
        ev.endedAt ? ["Ended", when(ev.endedAt) + (ev.outcome ? " (" + JSON.stringify(ev.outcome) + ")" : "")] : null,
      ]),
      actions(ev),
      section("Who reported it", reports, "No report kept."),
      section("Decisions", decisions, "No decision yet."),
      section("Approvals and their results", approvals, "No approval sent."),
      section("Alerts sent", alerts, "No alert."),
    ];
  }

  async function show() {
    const where = route();
    state.current = where;
    for (const name of ["pending", "fleet"]) {
      const link = $("nav-" + name);
      if (where.view === name) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
    }
    await refresh();
  }

  async function refresh() {
    if (!state.account || state.expired || state.busy) return;
    const where = state.current || route();
    state.busy = true;
    try {
      let nodes;
      if (where.view === "fleet") nodes = fleetView(await api("fleet") || { vms: [] });
      else if (where.view === "event") {
        const ev = await api("events/" + encodeURIComponent(where.id));
        nodes = ev ? storyView(ev) : null;
      } else {
        const events = await api("events/pending");
        nodes = events ? pendingView(events) : null;
      }
      if (nodes && !state.expired) {
        $("view").replaceChildren(...nodes.flat().filter(Boolean));
        state.fetchedAt = new Date();
        document.title = $("view").querySelector("h1").textContent + " · Scheduled events";
      }
    } catch (e) {
      notice("Could not read central: " + e.message);
    } finally {
      state.busy = false;
      tick();
    }
  }

  function tick() {
    const now = new Date();
    if (state.fetchedAt) {
      $("age").textContent = "Data from " + when(state.fetchedAt.toISOString()) + ", " + ago(now - state.fetchedAt) +
        (state.expired ? "; not refreshing (signed out)" : "; refreshes every " + REFRESH_MS / 1000 + " s");
    }
    for (const node of document.querySelectorAll("[data-notbefore]")) {
      node.textContent = countdown(node.getAttribute("data-notbefore"), now);
    }
  }

  // ---- deciding ------------------------------------------------------------------------------
  const VERBS = { Reboot: "reboots", Redeploy: "is redeployed", Freeze: "freezes", Preempt: "is evicted",
                  Terminate: "is deleted" };

  function consequence(ev, action) {
    const vms = list(ev.resources);
    const nb = ev.notBefore ? "its NotBefore " + when(ev.notBefore) + " (" + countdown(ev.notBefore, new Date()) + ")"
      : "no NotBefore";
    const policy = ev.decision ? " The policy had said: " + why(ev) + "." : "";
    if (action === "approve") {
      return vms + " " + (VERBS[ev.eventType] || "starts " + ev.eventType) + " now, not waiting for " + nb +
        ". Windows and budgets do not apply to an operator's approval." + policy;
    }
    if (action === "hold") {
      return "Central will not approve this " + ev.eventType + " of " + vms + " by itself until an operator " +
        "releases or approves it. Azure still starts it at " + nb + "." + policy;
    }
    return "The policy decides this " + ev.eventType + " of " + vms + " again, now: it may approve it at once." +
      policy;
  }

  function approveOptions(ev) {
    const radio = (value, label, checked) => el("label", { class: "option" },
      el("input", { type: "radio", name: "how", value: value, checked: checked }), " " + label);
    return el("fieldset", {}, el("legend", {}, "How"),
      radio("queue", "through the VM's forwarder (IMDS approval), now", true), el("br"),
      radio("hook", "through the VM's forwarder, after its pre-approval hook (drain)", false), el("br"),
      radio("arm", "through ARM (central acknowledges it; no VM involved)", false));
  }

  function confirmDecision(ev, action) {
    const dialog = $("confirm");
    $("confirm-title").textContent = action[0].toUpperCase() + action.slice(1) + " " + ev.eventType + " on " +
      list(ev.resources) + "?";
    $("confirm-what").textContent = consequence(ev, action);
    $("confirm-options").replaceChildren(action === "approve" ? approveOptions(ev) : "");
    $("confirm-reason").value = "";
    $("confirm-error").textContent = "";
    $("confirm-go").textContent = action[0].toUpperCase() + action.slice(1);
    dialog.dataset.event = ev.eventId;
    dialog.dataset.action = action;
    dialog.showModal();
    $("confirm-reason").focus();
  }

  async function submitDecision(e) {
    e.preventDefault();
    const dialog = $("confirm");
    const reason = $("confirm-reason").value.trim();
    if (!reason) { $("confirm-error").textContent = "A reason is required."; return; }
    const action = dialog.dataset.action;
    const body = { reason };
    const how = dialog.querySelector("input[name=how]:checked");
    if (action === "approve" && how && how.value === "hook") body.hook = true;
    if (action === "approve" && how && how.value === "arm") body.via = "arm";
    $("confirm-go").disabled = true;
    try {
      const result = await api("events/" + encodeURIComponent(dialog.dataset.event) + "/" + action, body);
      if (result) {
        dialog.close();
        notice("Done: " + action + " recorded (state now " + result.state + ") as " +
          ((result.decision && result.decision.decidedBy) || "you") + ".");
        await refresh();
      }
    } catch (err) {
      $("confirm-error").textContent = "Central refused: " + err.message;
    } finally {
      $("confirm-go").disabled = false;
    }
  }

  // ---- start -----------------------------------------------------------------------------------
  async function boot() {
    $("signin").addEventListener("click", signIn);
    $("signout").addEventListener("click", signOut);
    $("confirm-form").addEventListener("submit", submitDecision);
    $("confirm-cancel").addEventListener("click", () => $("confirm").close());
    window.addEventListener("hashchange", show);
    const resp = await fetch("/api/console/config.json", { cache: "no-store" });
    const config = await resp.json().catch(() => ({}));
    if (!resp.ok) { notice(config.error || "The console is not configured."); return; }
    state.config = config;
    state.app = new msal.PublicClientApplication({
      auth: { clientId: config.clientId, authority: config.authority, knownAuthorities: config.knownAuthorities,
              redirectUri: location.origin + config.redirectPath,
              postLogoutRedirectUri: location.origin + config.redirectPath },
      cache: { cacheLocation: "sessionStorage" },
    });
    await state.app.initialize();
    let result = null;
    try {
      result = await state.app.handleRedirectPromise();
    } catch (e) {
      notice("Sign-in failed: " + e.message, true);
    }
    state.account = (result && result.account) || state.app.getAllAccounts()[0] || null;
    if (!state.account) {
      $("signin").hidden = false;
      notice("Sign in with your work account to see pending events and the fleet.");
      return;
    }
    state.app.setActiveAccount(state.account);
    const claims = state.account.idTokenClaims || {};
    state.roles = Array.isArray(claims.roles) ? claims.roles : [];
    $("who").textContent = state.account.username + " (" + (state.roles.join(", ") || "no role") + ")";
    $("signout").hidden = false;
    await show();
    setInterval(tick, 1000);
    setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
  }

  document.addEventListener("DOMContentLoaded", () => {
    boot().catch((e) => notice("The console could not start: " + e.message));
  });
})();
