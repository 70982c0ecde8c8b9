/** Where the SDK logs. Pass your own (pino, winston, ...) through {@link RunOptions.logger}. */
export interface Logger {
  debug(message: string, fields?: Record<string, unknown>): void;
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

/** A log level of {@link consoleLogger}. */
export type LogLevel = "debug" | "info" | "warn" | "error" | "silent";

const LEVELS: readonly LogLevel[] = ["debug", "info", "warn", "error", "silent"];

/**
 * The default logger: one line per message on stderr, `LEVEL ctrlhub[name] message k=v ...`,
 * at `level` and above (default: env `CTRLHUB_LOG`, else `info`). A field that JSON cannot
 * represent (a `bigint`, a cycle) is written as text: logging never throws.
 */
export function consoleLogger(name: string, level?: LogLevel): Logger {
  const wanted = level ?? (process.env["CTRLHUB_LOG"] as LogLevel | undefined) ?? "info";
  const threshold = Math.max(0, LEVELS.indexOf(wanted));
  const line = (lvl: LogLevel, message: string, fields?: Record<string, unknown>): void => {
    if (LEVELS.indexOf(lvl) < threshold) {
      return;
    }
    const extra = Object.entries(fields ?? {})
      .map(([k, v]) => ` ${k}=${typeof v === "string" ? v : formatValue(v)}`)
      .join("");
    process.stderr.write(`${new Date().toISOString()} ${lvl.toUpperCase()} ctrlhub[${name}] ${message}${extra}\n`);
  };
  return {
    debug: (m, f) => line("debug", m, f),
    info: (m, f) => line("info", m, f),
    warn: (m, f) => line("warn", m, f),
    error: (m, f) => line("error", m, f),
  };
}

/** @internal A log field as JSON, with bigints as numbers' text; never throws. */
export function formatValue(value: unknown): string {
  try {
    return JSON.stringify(value, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v)) ?? String(value);
  } catch {
    try {
      return String(value);
    } catch {
      return "[unprintable]";
    }
  }
}
