import { create } from "@bufbuild/protobuf";
import { status as Status, type ServiceError } from "@grpc/grpc-js";

import { type Connection, authMetadata } from "./config.js";
import { GetRequestSchema, ListRequestSchema } from "./gen/ctrlhub/v1/read_pb.js";
import type { ManagerClient } from "./grpc.js";
import {
  type KubernetesObject,
  type ObjectMeta,
  type PartialObjectMetadata,
  type ResourceKind,
  type Selector,
  labelSelector,
  resourceType,
} from "./resources.js";

/** A cached read failed for a reason other than "not found". */
export class ReadError extends Error {
  override readonly name = "ReadError";
  /**
   * The gRPC status code (`@grpc/grpc-js`'s `status`): PERMISSION_DENIED, FAILED_PRECONDITION
   * (a type the session did not register, a session that ended, or a full read of a kind
   * cached metadata only), UNAVAILABLE, ...
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
 * One object as the manager served it ({@link CachedReader.read}): in full, or metadata only
 * when every `owns`/`watches` entry of its kind asked for `metadataOnly`.
 */
export type CachedObject<T> =
  | { readonly metadataOnly: false; readonly object: T; readonly resourceVersion: string }
  | { readonly metadataOnly: true; readonly object: PartialObjectMetadata; readonly resourceVersion: string };

/**
 * Reads through the manager's shared caches with the session that delivered a request: only
 * the types it registered (primary, owned, watched), within its namespaces and label
 * selector. Reads are eventually consistent; after writing an object, compare
 * resourceVersions or read the API server when that matters.
 *
 * Owned and watched kinds are cached in full unless every entry of the kind asks for
 * `metadataOnly`; such a kind is read with {@link CachedReader.getMetadata} and
 * {@link CachedReader.listMetadata}, typed {@link PartialObjectMetadata}. {@link CachedReader.get}
 * and {@link CachedReader.list} refuse it rather than return metadata typed as a full object.
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
   * One object from the cache in full, or `undefined` when it is not there (deleted, or
   * outside the session's scope).
   *
   * @throws {@link ReadError} for any other failure, and (code FAILED_PRECONDITION) when the
   *   kind is cached metadata only: use {@link CachedReader.getMetadata} then.
   */
  async get<T>(kind: ResourceKind<T>, options: GetOptions): Promise<T | undefined> {
    const read = await this.read(kind, options);
    if (read?.metadataOnly === true) {
      throw metadataOnly(kind);
    }
    return read?.object;
  }

  /**
   * One object's metadata, or `undefined` when it is not there: for a kind cached metadata
   * only, or any other (its metadata is taken from the full object).
   *
   * @throws {@link ReadError}
   */
  async getMetadata(kind: ResourceKind<unknown>, options: GetOptions): Promise<PartialObjectMetadata | undefined> {
    const read = await this.read(kind, options);
    return read === undefined ? undefined : read.metadataOnly ? read.object : partial(read.object as KubernetesObject);
  }

  /**
   * One object exactly as the manager served it: in full or metadata only (`GetResponse`), or
   * `undefined` when it is not there.
   *
   * @throws {@link ReadError}
   */
  async read<T>(kind: ResourceKind<T>, options: GetOptions): Promise<CachedObject<T> | undefined> {
    const request = create(GetRequestSchema, {
      sessionId: this.sessionId,
      resource: resourceType(kind),
      namespace: options.namespace ?? "",
      name: options.name,
    });
    let response;
    try {
      response = await this.client.get(request, await authMetadata(this.connection), options.signal);
    } catch (err) {
      if (isServiceError(err) && err.code === Status.NOT_FOUND) {
        return undefined;
      }
      throw readError("get", err);
    }
    const object = decodeRead("get", response.objectJson);
    return response.metadataOnly
      ? { metadataOnly: true, object: object as PartialObjectMetadata, resourceVersion: response.resourceVersion }
      : { metadataOnly: false, object: object as T, resourceVersion: response.resourceVersion };
  }

  /**
   * Every matching object in full, all pages read.
   *
   * @throws {@link ReadError}, also (FAILED_PRECONDITION) for a kind cached metadata only:
   *   use {@link CachedReader.listMetadata} then.
   */
  async list<T>(kind: ResourceKind<T>, options: ListOptions = {}): Promise<T[]> {
    const all: T[] = [];
    for await (const item of this.items(kind, options)) {
      all.push(item);
    }
    return all;
  }

  /**
   * Every matching object's metadata, all pages read, whatever form the kind is cached in.
   *
   * @throws {@link ReadError}
   */
  async listMetadata(kind: ResourceKind<unknown>, options: ListOptions = {}): Promise<PartialObjectMetadata[]> {
    const all: PartialObjectMetadata[] = [];
    for await (const item of this.itemsMetadata(kind, options)) {
      all.push(item);
    }
    return all;
  }

  /**
   * The matching objects in full, page by page as they are iterated, in namespace/name order.
   *
   * @throws {@link ReadError}, also for a kind cached metadata only (see {@link CachedReader.list}).
   */
  async *items<T>(kind: ResourceKind<T>, options: ListOptions = {}): AsyncGenerator<T, void, undefined> {
    for await (const page of this.pages(kind, options)) {
      if (page.metadataOnly) {
        throw metadataOnly(kind);
      }
      for (const object of page.objects) {
        yield object as T;
      }
    }
  }

  /**
   * The matching objects' metadata, page by page as they are iterated, in namespace/name
   * order, whatever form the kind is cached in.
   *
   * @throws {@link ReadError}
   */
  async *itemsMetadata(kind: ResourceKind<unknown>, options: ListOptions = {}): AsyncGenerator<PartialObjectMetadata, void, undefined> {
    for await (const page of this.pages(kind, options)) {
      for (const object of page.objects) {
        yield page.metadataOnly ? (object as PartialObjectMetadata) : partial(object as KubernetesObject);
      }
    }
  }

  private async *pages(
    kind: ResourceKind<unknown>,
    options: ListOptions,
  ): AsyncGenerator<{ metadataOnly: boolean; objects: unknown[] }, void, undefined> {
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
      yield { metadataOnly: page.metadataOnly, objects: page.items.map((item) => decodeRead("list", item.objectJson)) };
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
  }
}

const utf8 = new TextDecoder();

/** @internal Kubernetes JSON bytes to an object. */
export function decode<T>(bytes: Uint8Array): T {
  return JSON.parse(utf8.decode(bytes)) as T;
}

function decodeRead(what: string, bytes: Uint8Array): unknown {
  try {
    const value: unknown = decode(bytes);
    if (typeof value !== "object" || value === null) {
      throw new TypeError("not a JSON object");
    }
    return value;
  } catch (err) {
    throw new ReadError(Status.INTERNAL, `${what}: the manager sent an object that is not Kubernetes JSON: ${(err as Error).message}`, {
      cause: err,
    });
  }
}

function partial(object: KubernetesObject): PartialObjectMetadata {
  const metadata: ObjectMeta = { ...(object.metadata ?? {}) };
  const out: PartialObjectMetadata = { metadata };
  if (object.apiVersion !== undefined) {
    out.apiVersion = object.apiVersion;
  }
  if (object.kind !== undefined) {
    out.kind = object.kind;
  }
  return out;
}

function metadataOnly(kind: ResourceKind<unknown>): ReadError {
  const apiVersion = kind.group === "" ? kind.version : `${kind.group}/${kind.version}`;
  return new ReadError(
    Status.FAILED_PRECONDITION,
    `${apiVersion} ${kind.kind} is cached metadata only for this controller (every owns/watches entry of it sets ` +
      "metadataOnly): read it with getMetadata()/listMetadata(), or drop metadataOnly to read it in full",
  );
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
