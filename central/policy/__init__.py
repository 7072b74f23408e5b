"""Policy: what central decides, as pure functions of (event, fleet state, policy, now) -> verdict.

- document:          the policy document (POLICY_JSON): rules, windows, budgets; load() or PolicyError
- validation:        every schema and semantic error of a document at once (se-policy check)
- lint:              warnings about a document that loads (rules that never match, shadowed rules...)
- matching:          whether a rule's conditions fit an event and its VMs, and why not
- budgets:           disruption budgets: groups, limits, whether one more event fits
- leader:            which named VM carries an approval out, and failover
- decide:            the one decision function the runtime commits and `se-policy whatif` replays
- operator_verdicts: an operator's approve, hold and release as verdicts
- approval_results:  what a VM's approval result does to its event

No I/O, no clock, no storage types: the same inputs give the same verdict on any instance or tool.
May import: central.model, schemas.
Must never be imported by: central.model. (Store, intake, runtime and cli build on it.)
"""
