import { type DescMessage, type MessageShape, fromBinary, toBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";

import { ControllerManager } from "./gen/ctrlhub/v1/controller_pb.js";

/**
 * @internal The ControllerManager service on grpc-js, from the descriptors protoc-gen-es
 * generated: paths and codecs come from the generated schemas, so no wire format is
 * hand-written here.
 */
export class ManagerClient {
  private readonly client: grpc.Client;

  constructor(target: string, credentials: grpc.ChannelCredentials, options: grpc.ChannelOptions) {
    this.client = new grpc.Client(target, credentials, options);
  }

  /** Opens the Connect stream. */
  connect(metadata: grpc.Metadata): grpc.ClientDuplexStream<
    MessageShape<typeof ControllerManager.method.connect.input>,
    MessageShape<typeof ControllerManager.method.connect.output>
  > {
    const m = ControllerManager.method.connect;
    return this.client.makeBidiStreamRequest(path(m.name), encoder(m.input), decoder(m.output), metadata);
  }

  /** `Get`. */
  get(
    request: MessageShape<typeof ControllerManager.method.get.input>,
    metadata: grpc.Metadata,
    signal?: AbortSignal,
  ): Promise<MessageShape<typeof ControllerManager.method.get.output>> {
    const m = ControllerManager.method.get;
    return this.unary(m.name, m.input, m.output, request, metadata, signal);
  }

  /** `List`. */
  list(
    request: MessageShape<typeof ControllerManager.method.list.input>,
    metadata: grpc.Metadata,
    signal?: AbortSignal,
  ): Promise<MessageShape<typeof ControllerManager.method.list.output>> {
    const m = ControllerManager.method.list;
    return this.unary(m.name, m.input, m.output, request, metadata, signal);
  }

  /** Closes the channel (and with it the connection of this session). */
  close(): void {
    this.client.close();
  }

  private unary<I extends DescMessage, O extends DescMessage>(
    name: string,
    input: I,
    output: O,
    request: MessageShape<I>,
    metadata: grpc.Metadata,
    signal: AbortSignal | undefined,
  ): Promise<MessageShape<O>> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const call = this.client.makeUnaryRequest(
        path(name),
        encoder(input),
        decoder(output),
        request,
        metadata,
        (err, value) => {
          signal?.removeEventListener("abort", cancel);
          if (err !== null || value === undefined) {
            reject(err ?? new Error(`${name}: no response`));
          } else {
            resolve(value);
          }
        },
      );
      const cancel = (): void => call.cancel();
      signal?.addEventListener("abort", cancel, { once: true });
    });
  }
}

function path(method: string): string {
  return `/${ControllerManager.typeName}/${method}`;
}

function encoder<D extends DescMessage>(schema: D): (value: MessageShape<D>) => Buffer {
  return (value) => {
    const bytes = toBinary(schema, value);
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  };
}

function decoder<D extends DescMessage>(schema: D): (bytes: Buffer) => MessageShape<D> {
  return (bytes) => fromBinary(schema, bytes);
}
