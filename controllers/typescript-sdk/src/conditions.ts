/**
 * `metav1.Condition` helpers with apimachinery's `meta.SetStatusCondition` semantics:
 * `lastTransitionTime` changes only when `status` changes.
 *
 * @module
 */

/** A `metav1.Condition` (`@kubernetes/client-node`'s `V1Condition` fits). */
export interface Condition {
  type: string;
  status: "True" | "False" | "Unknown" | string;
  reason: string;
  message: string;
  observedGeneration?: number;
  /** RFC 3339; `@kubernetes/client-node` uses `Date`. Set to now on a transition when unset. */
  lastTransitionTime?: Date | string;
}

/** A condition to set: `status` may be a boolean. */
export interface NewCondition {
  type: string;
  status: boolean | "True" | "False" | "Unknown";
  reason: string;
  message?: string;
  observedGeneration?: number;
  lastTransitionTime?: Date | string;
}

/**
 * Sets `condition` in `conditions` (matched by type, in place) and reports whether anything
 * changed. A new condition, or one whose status changed, gets `lastTransitionTime` from
 * `condition` or `now` (whole seconds, as Kubernetes stores it); otherwise the existing
 * transition time is kept while reason, message and observedGeneration are updated.
 *
 * @param now the clock, replaceable in tests
 * @example
 * ```ts
 * const conditions = cm.status?.conditions ?? [];
 * if (setCondition(conditions, { type: "Ready", status: true, reason: "Stamped" })) {
 *   // patch the status
 * }
 * ```
 */
export function setCondition<C extends Condition>(conditions: C[], condition: NewCondition, now: () => Date = () => new Date()): boolean {
  const status = typeof condition.status === "boolean" ? (condition.status ? "True" : "False") : condition.status;
  const transition = (): Date => {
    if (condition.lastTransitionTime !== undefined) {
      return new Date(condition.lastTransitionTime);
    }
    const t = now();
    return new Date(Math.floor(t.getTime() / 1000) * 1000);
  };
  const existing = conditions.find((c) => c.type === condition.type);
  if (existing === undefined) {
    const added: Condition = {
      type: condition.type,
      status,
      reason: condition.reason,
      message: condition.message ?? "",
      lastTransitionTime: transition(),
    };
    if (condition.observedGeneration !== undefined) {
      added.observedGeneration = condition.observedGeneration;
    }
    conditions.push(added as C);
    return true;
  }
  let changed = false;
  if (existing.status !== status) {
    existing.status = status;
    existing.lastTransitionTime = transition();
    changed = true;
  }
  if (existing.reason !== condition.reason) {
    existing.reason = condition.reason;
    changed = true;
  }
  const message = condition.message ?? "";
  if (existing.message !== message) {
    existing.message = message;
    changed = true;
  }
  if (existing.observedGeneration !== condition.observedGeneration) {
    if (condition.observedGeneration === undefined) {
      delete existing.observedGeneration;
    } else {
      existing.observedGeneration = condition.observedGeneration;
    }
    changed = true;
  }
  return changed;
}

/** The condition of `type`, if present. */
export function findCondition<C extends Condition>(conditions: readonly C[] | undefined, type: string): C | undefined {
  return conditions?.find((c) => c.type === type);
}

/** Removes the condition of `type` (in place); reports whether it was present. */
export function removeCondition<C extends Condition>(conditions: C[], type: string): boolean {
  const i = conditions.findIndex((c) => c.type === type);
  if (i < 0) {
    return false;
  }
  conditions.splice(i, 1);
  return true;
}

/** Whether the condition of `type` is present with status `"True"`. */
export function isConditionTrue(conditions: readonly Condition[] | undefined, type: string): boolean {
  return findCondition(conditions, type)?.status === "True";
}
