import { create } from "@bufbuild/protobuf";
import { status as Status, type ServiceError } from "@grpc/grpc-js";

import { type Connection, authMetadata } from "./config.js";
import { GetRequestSchema, ListRequestSchema } from "./gen/ctrlhub/v1/read_pb.js";
import type { ManagerClient } from "./grpc.js";
import { type ResourceKind, type Selector, labelSelector, resourceType } from "./resources.js";

/** A cached read failed for a reason other than "not found". */
export class ReadError extends Error {
  override readonly name = "ReadError";
  /**
   * The gRPC status code (`@grpc/grpc-js`'s `status`): PERMISSION_DENIED, FAILED_PRECONDITION
   * (a type the session did not register, or a session that ended), UNAVAILABLE, ...
   */
  readonly code: number;

  /** @internal */
  constructor(code: number, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }
}

/** Which object {@link CachedReader.get} reads. */
export interface GetOptions {
  /** The object's name. */
  readonly name: string;
  /** Its namespace; omit for cluster-scoped types. */
  readonly namespace?: string;
  /** Cancels the read. */
  readonly signal?: AbortSignal;
}

/** Which objects {@link CachedReader.list} reads. */
export interface ListOptions {
  /** One namespace; omit for every namespace of the session's scope. */
  readonly namespace?: string;
  /** Only objects matching this selector (on top of the registration's own). */
  readonly labels?: Selector;
  /** Objects per page (the manager's default is 500, at most 5000). */
  readonly pageSize?: number;
  /** Cancels the read. */
  readonly signal?: AbortSignal;
}

/**
 * Reads through the manager's shared caches with the session that delivered a request: only
 * the types it registered (primary, owned, watched), within its namespaces and label
 * selector. Reads are eventually consistent; after writing an object, compare
 * resourceVersions or read the API server when that matters.
 */
export class CachedReader {
  /** @internal */
  constructor(
    private readonly client: ManagerClient,
    private readonly connection: Connection,
    /** The session the reads go through (`Registered.session_id`). */
    readonly sessionId: string,
  ) {}

  /**
   * One object from the cache, or `undefined` when it is not there (deleted, or outside the
   * session's scope).
   *
   * @throws {@link ReadError} for any other failure.
   */
  async get<T>(kind: ResourceKind<T>, options: GetOptions): Promise<T | undefined> {
    const request = create(GetRequestSchema, {
      sessionId: this.sessionId,
      resource: resourceType(kind),
      namespace: options.namespace ?? "",
      name: options.name,
    });
    try {
      const response = await this.client.get(request, await authMetadata(this.connection), options.signal);
      return decode<T>(response.objectJson);
    } catch (err) {
      if (isServiceError(err) && err.code === Status.NOT_FOUND) {
        return undefined;
      }
      throw readError("get", err);
    }
  }

  /**
   * Every matching object, all pages read.
   *
   * @throws {@link ReadError}
   */
  async list<T>(kind: ResourceKind<T>, options: ListOptions = {}): Promise<T[]> {
    const all: T[] = [];
    for await (const item of this.items(kind, options)) {
      all.push(item);
    }
    return all;
  }

  /**
   * The matching objects, page by page as they are iterated, in namespace/name order.
   *
   * @throws {@link ReadError}
   */
  async *items<T>(kind: ResourceKind<T>, options: ListOptions = {}): AsyncGenerator<T, void, undefined> {
    let pageToken = "";
    do {
      const request = create(ListRequestSchema, {
        sessionId: this.sessionId,
        resource: resourceType(kind),
        namespace: options.namespace ?? "",
        pageSize: options.pageSize ?? 0,
        pageToken,
      });
      if (options.labels !== undefined) {
        request.labelSelector = labelSelector(options.labels);
      }
      let page;
      try {
        page = await this.client.list(request, await authMetadata(this.connection), options.signal);
      } catch (err) {
        throw readError("list", err);
      }
      for (const item of page.items) {
        yield decode<T>(item.objectJson);
      }
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
  }
}

const utf8 = new TextDecoder();

/** @internal Kubernetes JSON bytes to an object. */
export function decode<T>(bytes: Uint8Array): T {
  return JSON.parse(utf8.decode(bytes)) as T;
}

function isServiceError(err: unknown): err is ServiceError {
  return err instanceof Error && typeof (err as Partial<ServiceError>).code === "number";
}

function readError(what: string, err: unknown): unknown {
  if (err instanceof ReadError || !isServiceError(err)) {
    return err;
  }
  return new ReadError(err.code, `${what}: ${Status[err.code] ?? err.code}: ${err.details}`, { cause: err });
}
