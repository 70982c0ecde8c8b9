/**
 * The generated `ctrlhub.v1` wire types (protoc-gen-es, from `proto/` at build time), for
 * callers that need a field the SDK does not surface, e.g. the `Registered.effective`
 * registration passed to `RunOptions.onRegistered`.
 *
 * @module
 */
export * from "./gen/ctrlhub/v1/controller_pb.js";
export * from "./gen/ctrlhub/v1/read_pb.js";
export * from "./gen/ctrlhub/v1/registration_pb.js";
export * from "./gen/ctrlhub/v1/resource_pb.js";
