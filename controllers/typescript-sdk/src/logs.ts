/**
 * Log output a controller can be run on, configured the same way in every ctrlhub SDK:
 *
 * - `CTRLHUB_LOG`: the level, `error`, `warn`, `info` (the default), `debug` or `trace` (or
 *   `off`). Anything else fails {@link Controller.run} with a {@link ConfigError}.
 * - `CTRLHUB_LOG_FORMAT`: `text` (the default) or `json`, one object per line in the manager's
 *   shape: `timestamp`, `level`, `target`, `fields` (with `message`) and, inside a reconcile,
 *   `span` with its `key`, `request_id`, `attempt`, `controller`, `session_id` and the
 *   `trace_id` and `span_id` of the reconcile's trace.
 *
 * No level changes what the controller does: a line is formatted only once it is due, and
 * formatting never throws (a `bigint` is written as its digits, a cycle as text).
 *
 * @module
 */
import { ConfigError } from "./errors.js";

/**
 * Where the SDK logs. {@link consoleLogger} is the default; pass your own through
 * {@link RunOptions.logger} (an adapter for pino or winston is a few lines: see the README).
 */
export interface Logger {
  /** Wire-level detail (every message to and from the manager). Optional. */
  trace?(message: string, fields?: Record<string, unknown>): void;
  debug(message: string, fields?: Record<string, unknown>): void;
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
  /**
   * A logger whose every line carries `fields` (the SDK makes one per request, with its key
   * and request id). Optional: without it, the SDK adds the fields to each line's own.
   */
  child?(fields: Record<string, unknown>): Logger;
}

/** A log level; `off` (or `silent`) logs nothing. */
export type LogLevel = "trace" | "debug" | "info" | "warn" | "error" | "off" | "silent";

/** How lines are written: human-readable text, or one JSON object per line. */
export type LogFormat = "text" | "json";

/** Settings of {@link consoleLogger}; every field has a default. */
export interface LogOptions {
  /** Default: env `CTRLHUB_LOG`, else `info`. */
  readonly level?: LogLevel;
  /** Default: env `CTRLHUB_LOG_FORMAT`, else `text`. */
  readonly format?: LogFormat;
  /** The JSON lines' `target`. Default `@ctrlhub/sdk`. */
  readonly target?: string;
  /** Where a finished line goes. Default: stderr. */
  readonly write?: (line: string) => void;
}

/** The environment variable holding the level. */
export const LEVEL_ENV = "CTRLHUB_LOG";
/** The environment variable holding the format. */
export const FORMAT_ENV = "CTRLHUB_LOG_FORMAT";

const RANK: Record<string, number> = { trace: 0, debug: 1, info: 2, warn: 3, error: 4, off: 5, silent: 5 };

/**
 * The level and format from `CTRLHUB_LOG` and `CTRLHUB_LOG_FORMAT` (`info` and `text` when
 * unset).
 *
 * @throws {@link ConfigError} naming the variable when a value is neither.
 */
export function logSettingsFromEnv(env: NodeJS.ProcessEnv = process.env): { level: LogLevel; format: LogFormat } {
  return { level: levelFromEnv(env), format: formatFromEnv(env) };
}

function levelFromEnv(env: NodeJS.ProcessEnv): LogLevel {
  const raw = env[LEVEL_ENV]?.trim().toLowerCase() ?? "";
  const level = raw === "" ? "info" : raw === "warning" ? "warn" : raw;
  if (!(level in RANK)) {
    throw new ConfigError(`${LEVEL_ENV}=${JSON.stringify(env[LEVEL_ENV])} is not a log level: use error, warn, info, debug, trace or off`);
  }
  return level as LogLevel;
}

function formatFromEnv(env: NodeJS.ProcessEnv): LogFormat {
  const raw = env[FORMAT_ENV]?.trim().toLowerCase() ?? "";
  const format = raw === "" ? "text" : raw;
  if (format !== "text" && format !== "json") {
    throw new ConfigError(`${FORMAT_ENV}=${JSON.stringify(env[FORMAT_ENV])} is not a log format: use text or json`);
  }
  return format;
}

/**
 * The default logger: one line per message on stderr at `level` and above. Text lines read
 * `2026-01-02T03:04:05.678Z INFO ctrlhub[name] message k=v ...` (inside a reconcile,
 * `reconcile{key=ns/name attempt=1 request_id=...}: message ...`); JSON lines have the
 * manager's shape (see the module's documentation).
 *
 * @param name the controller's name (text lines' `ctrlhub[name]`)
 * @param options a level, or {@link LogOptions}; unset values come from `CTRLHUB_LOG` and
 *   `CTRLHUB_LOG_FORMAT`
 * @throws {@link ConfigError} when a setting taken from the environment is invalid
 */
export function consoleLogger(name: string, options: LogLevel | LogOptions = {}): Logger {
  const o: LogOptions = typeof options === "string" ? { level: options } : options;
  const level = o.level ?? levelFromEnv(process.env);
  if (!(level in RANK)) {
    throw new ConfigError(`unknown log level ${JSON.stringify(level)}: use error, warn, info, debug, trace or off`);
  }
  return new ConsoleLogger({
    name,
    threshold: RANK[level] as number,
    json: (o.format ?? formatFromEnv(process.env)) === "json",
    target: o.target ?? "@ctrlhub/sdk",
    write: o.write ?? ((line) => process.stderr.write(line)),
    span: undefined,
  });
}

interface Settings {
  readonly name: string;
  readonly threshold: number;
  readonly json: boolean;
  readonly target: string;
  readonly write: (line: string) => void;
  /** Fields of the span this logger's lines are in (`child`). */
  readonly span: Record<string, unknown> | undefined;
}

class ConsoleLogger implements Logger {
  constructor(private readonly s: Settings) {}

  trace(message: string, fields?: Record<string, unknown>): void {
    this.line(0, "TRACE", message, fields);
  }
  debug(message: string, fields?: Record<string, unknown>): void {
    this.line(1, "DEBUG", message, fields);
  }
  info(message: string, fields?: Record<string, unknown>): void {
    this.line(2, "INFO", message, fields);
  }
  warn(message: string, fields?: Record<string, unknown>): void {
    this.line(3, "WARN", message, fields);
  }
  error(message: string, fields?: Record<string, unknown>): void {
    this.line(4, "ERROR", message, fields);
  }
  child(fields: Record<string, unknown>): Logger {
    return new ConsoleLogger({ ...this.s, span: { ...(this.s.span ?? {}), ...fields } });
  }

  private line(rank: number, level: string, message: string, fields: Record<string, unknown> | undefined): void {
    if (rank < this.s.threshold) {
      return;
    }
    try {
      this.s.write(this.s.json ? this.jsonLine(level, message, fields) : this.textLine(level, message, fields));
    } catch {
      // Logging never fails the caller.
    }
  }

  private jsonLine(level: string, message: string, fields: Record<string, unknown> | undefined): string {
    const line: Record<string, unknown> = {
      timestamp: timestamp(),
      level,
      fields: { message, ...(fields ?? {}) },
      target: this.s.target,
    };
    if (this.s.span !== undefined) {
      line["span"] = this.s.span;
    }
    return `${formatValue(line)}\n`;
  }

  private textLine(level: string, message: string, fields: Record<string, unknown> | undefined): string {
    const span = this.s.span;
    let prefix = "";
    const shown = ["key", "attempt", "request_id"].filter((k) => span?.[k] !== undefined);
    if (span !== undefined) {
      prefix = `${String(span["name"] ?? "span")}{${shown.map((k) => `${k}=${text(span[k])}`).join(" ")}}: `;
    }
    let stack = "";
    const extra = Object.entries(fields ?? {})
      .map(([k, v]) => {
        if (shown.includes(k) && span?.[k] === v) {
          return ""; // the span says it already
        }
        if (k === "stack" && typeof v === "string") {
          stack = `\n${v.replace(/^/gm, "    ")}`;
          return "";
        }
        return ` ${k}=${text(v)}`;
      })
      .join("");
    return `${new Date().toISOString()} ${level.padEnd(5)} ctrlhub[${this.s.name}] ${prefix}${message}${extra}${stack}\n`;
  }
}

/** RFC 3339 UTC with microseconds, as the manager writes it. */
function timestamp(): string {
  const us = Math.floor((performance.timeOrigin + performance.now()) * 1000);
  const iso = new Date(Math.floor(us / 1000)).toISOString();
  return `${iso.slice(0, 19)}.${String(us % 1_000_000).padStart(6, "0")}Z`;
}

function text(v: unknown): string {
  return typeof v === "string" ? (v === "" || /\s/.test(v) ? JSON.stringify(v) : v) : formatValue(v);
}

/** @internal A log field as JSON, with bigints as their digits and errors as their message; never throws. */
export function formatValue(value: unknown): string {
  try {
    return (
      JSON.stringify(value, (_k, v: unknown) =>
        typeof v === "bigint" ? v.toString() : v instanceof Error ? v.message || v.name : v,
      ) ?? String(value)
    );
  } catch {
    try {
      return String(value);
    } catch {
      return "[unprintable]";
    }
  }
}

/**
 * @internal `log` with the fields of span `span` on every line: its own `child` when it has
 * one (the span's name included), else the fields merged into each line's.
 */
export function withFields(log: Logger, span: string, fields: Record<string, unknown>): Logger {
  if (typeof log.child === "function") {
    return log.child({ name: span, ...fields });
  }
  const merged = (f?: Record<string, unknown>): Record<string, unknown> => ({ ...fields, ...(f ?? {}) });
  return {
    trace: (m, f) => log.trace?.(m, merged(f)),
    debug: (m, f) => log.debug(m, merged(f)),
    info: (m, f) => log.info(m, merged(f)),
    warn: (m, f) => log.warn(m, merged(f)),
    error: (m, f) => log.error(m, merged(f)),
    child: (more) => withFields(log, span, { ...fields, ...more }),
  };
}

/**
 * @internal Stack traces of failed handlers at most once per key per `everyMs` (the rest are
 * one line each), remembering at most `max` keys.
 */
export class StackLimiter {
  private readonly last = new Map<string, number>();

  constructor(
    private readonly everyMs = 60_000,
    private readonly max = 4096,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** Whether the stack of a failure of `key` is due now (and records it). */
  due(key: string): boolean {
    const now = this.now();
    const at = this.last.get(key);
    if (at !== undefined && now - at < this.everyMs) {
      return false;
    }
    if (this.last.size >= this.max) {
      for (const [k, t] of this.last) {
        if (now - t >= this.everyMs) {
          this.last.delete(k);
        }
      }
      if (this.last.size >= this.max) {
        this.last.delete(this.last.keys().next().value as string);
      }
    }
    this.last.delete(key);
    this.last.set(key, now);
    return true;
  }
}
