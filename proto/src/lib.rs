//! ctrlhub's public gRPC API, package `ctrlhub.v1`, generated from
//! `proto/ctrlhub/v1/*.proto`.
//!
//! The `.proto` files are the specification: every message and field is
//! documented there (and the comments carry over into the rustdoc of
//! [`v1`]), including the contract a controller can rely on (level-triggered,
//! exclusive, at-least-once, requeue-after, backoff, terminal, deadline,
//! priority, scoping, single leader) and the gRPC status codes used for
//! errors. Other languages generate their clients from the same files.
//!
//! Code is generated at build time with protox (pure Rust, no `protoc`
//! needed) and tonic-prost-build: [`v1::controller_manager_server`] for the
//! manager and [`v1::controller_manager_client`] for controllers and tests.
//! Keep proto types at the gRPC edge and translate them into domain types.

/// Generated messages, enums, client and server for `ctrlhub.v1`.
pub mod v1 {
    // No `#![allow(missing_docs)]` here on purpose. buf's COMMENTS rules
    // (`proto/lint.sh`) require a comment on every proto element, prost and
    // tonic carry those comments into rustdoc, and so `missing_docs` stays
    // on as a second check that the documentation really reaches generated
    // clients. Should a prost/tonic upgrade start emitting undocumented
    // helper items, allow the lint on this module only (generated code
    // cannot be fixed by hand, while our own items must stay documented),
    // not crate-wide.
    tonic::include_proto!("ctrlhub.v1");
}

/// The encoded `google.protobuf.FileDescriptorSet` of `ctrlhub.v1` (with its
/// imports and source comments), e.g. for `tonic-reflection` or for tools
/// that decode ctrlhub messages dynamically.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ctrlhub_v1_descriptor.bin"));

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use prost_types::{Duration, FileDescriptorSet};

    use super::v1::{
        ControllerMessage, LabelSelector, LabelSelectorRequirement, NamespaceScope, OwnedResource,
        Predicate, ReconcileResult, Register, ResourceType, WatchedResource, controller_message,
        label_selector_requirement, namespace_scope, predicate, reconcile_result, register,
        watched_resource,
    };

    fn gvk(group: &str, version: &str, kind: &str) -> ResourceType {
        ResourceType {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: String::new(),
        }
    }

    /// A registration using every construct: oneofs, nested predicate trees
    /// (including the boxed `negate`), maps, repeated messages, durations.
    #[test]
    fn register_round_trips() -> Result<(), prost::DecodeError> {
        let register = Register {
            controller_name: "widget-controller".into(),
            mode: register::Mode::Reconcile.into(),
            primary: Some(ResourceType {
                plural: "widgets".into(),
                ..gvk("example.com", "v1", "Widget")
            }),
            owns: vec![OwnedResource {
                resource: Some(gvk("apps", "v1", "Deployment")),
                controller_only: true,
                predicate: None,
                metadata_only: true,
            }],
            watches: vec![WatchedResource {
                resource: Some(gvk("", "v1", "Secret")),
                mapping: Some(watched_resource::Mapping::FieldPath(
                    "spec.widgetRef".into(),
                )),
                predicate: None,
                metadata_only: false,
            }],
            namespaces: Some(NamespaceScope {
                scope: Some(namespace_scope::Scope::LabelSelector(LabelSelector {
                    match_labels: [("team".to_owned(), "a".to_owned())].into(),
                    match_expressions: vec![LabelSelectorRequirement {
                        key: "env".into(),
                        operator: label_selector_requirement::Operator::In.into(),
                        values: vec!["prod".into(), "staging".into()],
                    }],
                })),
            }),
            label_selector: None,
            predicate: Some(Predicate {
                predicate: Some(predicate::Predicate::AnyOf(predicate::AnyOf {
                    predicates: vec![
                        Predicate {
                            predicate: Some(predicate::Predicate::GenerationChanged(
                                predicate::GenerationChanged {},
                            )),
                        },
                        Predicate {
                            predicate: Some(predicate::Predicate::Negate(Box::new(Predicate {
                                predicate: Some(predicate::Predicate::HasFinalizer(
                                    predicate::HasFinalizer {
                                        name: "example.com/cleanup".into(),
                                    },
                                )),
                            }))),
                        },
                    ],
                })),
            }),
            max_concurrent_reconciles: 8,
            max_in_flight: 4,
            request_deadline: Some(Duration {
                seconds: 30,
                nanos: 0,
            }),
            resync_period: Some(Duration::default()),
            backoff: None,
            include_object: true,
            revision: 3,
            exclusive_attempts: true,
            max_batch: 64,
        };
        let message = ControllerMessage {
            message: Some(controller_message::Message::Register(Box::new(
                register.clone(),
            ))),
        };

        let decoded = ControllerMessage::decode(message.encode_to_vec().as_slice())?;

        assert_eq!(decoded, message);
        let Some(controller_message::Message::Register(got)) = decoded.message else {
            panic!("expected a Register, got {:?}", decoded.message);
        };
        assert_eq!(got.controller_name, "widget-controller");
        assert_eq!(got.mode(), register::Mode::Reconcile);
        assert_eq!(
            got.owns[0].resource.as_ref().map(|r| r.kind.as_str()),
            Some("Deployment")
        );
        assert!(got.owns[0].controller_only);
        // Presence matters: an explicit zero resync period disables resync,
        // while an unset one means the default.
        assert_eq!(got.resync_period, Some(Duration::default()));
        assert_eq!(got.backoff, None);
        assert_eq!(*got, register);
        Ok(())
    }

    #[test]
    fn reconcile_result_round_trips() -> Result<(), prost::DecodeError> {
        let results = [
            reconcile_result::Outcome::Done(reconcile_result::Done {}),
            reconcile_result::Outcome::RequeueAfter(reconcile_result::RequeueAfter {
                delay: Some(Duration {
                    seconds: 90,
                    nanos: 500,
                }),
            }),
            reconcile_result::Outcome::Error(reconcile_result::Error {
                message: "apiserver said 429".into(),
                retry_after: Some(Duration {
                    seconds: 2,
                    nanos: 0,
                }),
            }),
            reconcile_result::Outcome::Terminal(reconcile_result::Terminal {
                message: "spec.size must be positive".into(),
            }),
        ];
        for outcome in results {
            let result = ReconcileResult {
                id: "r-42".into(),
                outcome: Some(outcome),
            };
            let message = ControllerMessage {
                message: Some(controller_message::Message::Result(result.clone())),
            };

            let decoded = ControllerMessage::decode(message.encode_to_vec().as_slice())?;

            assert_eq!(
                decoded.message,
                Some(controller_message::Message::Result(result))
            );
        }
        Ok(())
    }

    /// An empty outcome must stay distinguishable from `Done`: the manager
    /// treats it as an error (see ReconcileResult.outcome).
    #[test]
    fn unset_outcome_is_not_done() -> Result<(), prost::DecodeError> {
        let result = ReconcileResult {
            id: "r-1".into(),
            outcome: None,
        };
        let decoded = ReconcileResult::decode(result.encode_to_vec().as_slice())?;
        assert_eq!(decoded.outcome, None);
        Ok(())
    }

    /// The embedded descriptor set is complete enough for reflection: it
    /// holds the service, its imports, and the source comments.
    #[test]
    fn file_descriptor_set_describes_the_service() -> Result<(), prost::DecodeError> {
        let fds = FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET)?;
        let files: Vec<&str> = fds.file.iter().map(|f| f.name()).collect();
        assert!(
            files.contains(&"google/protobuf/duration.proto"),
            "{files:?}"
        );

        let controller = fds
            .file
            .iter()
            .find(|f| f.name() == "ctrlhub/v1/controller.proto");
        let Some(controller) = controller else {
            panic!("controller.proto missing from {files:?}");
        };
        assert_eq!(controller.package(), "ctrlhub.v1");
        let methods: Vec<&str> = controller.service[0]
            .method
            .iter()
            .map(|m| m.name())
            .collect();
        assert_eq!(controller.service[0].name(), "ControllerManager");
        assert_eq!(methods, ["Connect", "Get", "List"]);
        let documented = controller
            .source_code_info
            .as_ref()
            .is_some_and(|info| info.location.iter().any(|l| l.leading_comments.is_some()));
        assert!(documented, "source comments were not embedded");
        Ok(())
    }
}
