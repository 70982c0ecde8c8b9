//! Ring mode: a member that does not own this controller (or whose controller moved away) says
//! where its owner listens; the next session dials that address at once, at most
//! [`MAX_REDIRECTS`] times in a row without a `Registered`, then goes back to the configured
//! address with the normal backoff (members' views of the ring can briefly differ, and bouncing
//! between two of them for ever would be a storm).
//!
//! - [`Owner`]: where a `Rejected`, a `Revoked(UNIT_MOVED)` or a status's trailers say the owner
//!   is;
//! - [`Redirects`]: the redirects followed in a row, and the address the next session dials;
//! - [`owner_uri`]: that address as a URL with the configured scheme, and its TLS server name.

use ctrlhub_proto::v1 as pb;

use crate::{Config, ConfigError};

/// Redirects followed in a row without a `Registered`; the next one is not followed.
pub(crate) const MAX_REDIRECTS: u32 = 3;

/// The trailer naming the owner's identity (`Rejected.owner_identity`).
const OWNER_TRAILER: &str = "ctrlhub-owner";
/// The trailer naming where the owner listens (`Rejected.owner_address`, `host:port`).
const OWNER_ADDR_TRAILER: &str = "ctrlhub-owner-addr";

/// The member that owns this controller, as another member named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    /// Its identity (may be empty when only the address is known).
    pub(crate) identity: String,
    /// Where it listens: `host:port`, without a scheme.
    pub(crate) addr: String,
}

impl Owner {
    fn new(identity: &str, addr: &str) -> Option<Self> {
        let addr = addr.trim();
        (!addr.is_empty()).then(|| Self {
            identity: identity.to_owned(),
            addr: addr.to_owned(),
        })
    }

    /// A `Rejected` with UNAVAILABLE and an owner address: another member owns the controller.
    pub(crate) fn from_rejected(rej: &pb::Rejected) -> Option<Self> {
        if tonic::Code::from_i32(rej.code) != tonic::Code::Unavailable {
            return None;
        }
        Self::new(&rej.owner_identity, &rej.owner_address)
    }

    /// A `Revoked(UNIT_MOVED)` with an owner address (`leader_identity` names the new owner).
    /// Without an address the owner is not known yet: reconnect through the configured one.
    pub(crate) fn from_revoked(rev: &pb::Revoked) -> Option<Self> {
        if rev.reason != pb::revoked::Reason::UnitMoved as i32 {
            return None;
        }
        Self::new(&rev.leader_identity, &rev.owner_address)
    }

    /// An UNAVAILABLE status whose trailers carry `ctrlhub-owner-addr` (and `ctrlhub-owner`).
    pub(crate) fn from_status(status: &tonic::Status) -> Option<Self> {
        if status.code() != tonic::Code::Unavailable {
            return None;
        }
        let trailer = |name: &str| {
            status
                .metadata()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        Self::new(&trailer(OWNER_TRAILER), &trailer(OWNER_ADDR_TRAILER))
    }
}

/// What to do after a session ended with a redirect.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Follow {
    /// Dial the owner at once; the number of redirects in a row so far.
    Dial(u32),
    /// Too many redirects in a row: back to the configured address, with backoff.
    TooMany,
}

/// The redirects followed in a row, and the owner the next session dials (none: the configured
/// address).
#[derive(Debug, Default)]
pub(crate) struct Redirects {
    in_a_row: u32,
    next: Option<Owner>,
}

impl Redirects {
    /// Where the next session dials: the owner a redirect named, or `None` for the configured
    /// address.
    pub(crate) fn target(&self) -> Option<&Owner> {
        self.next.as_ref()
    }

    /// A session ended with a redirect to `owner`; `registered` when it had been registered (a
    /// `Registered` resets the count). The 4th in a row is not followed.
    pub(crate) fn redirected(&mut self, owner: Owner, registered: bool) -> Follow {
        if registered {
            self.in_a_row = 0;
        }
        self.in_a_row += 1;
        if self.in_a_row > MAX_REDIRECTS {
            self.back_to_configured();
            return Follow::TooMany;
        }
        self.next = Some(owner);
        Follow::Dial(self.in_a_row)
    }

    /// Any other end of a session (a failure, a different status, an outdated definition):
    /// the next session dials the configured address, and the count starts again.
    pub(crate) fn back_to_configured(&mut self) {
        self.in_a_row = 0;
        self.next = None;
    }
}

/// The owner's address as a URL with the configured scheme (`https` when [`Config::tls`] is
/// set), and the host its certificate must name. A redirect never changes the scheme: an
/// address with one of its own is refused.
pub(crate) fn owner_uri(config: &Config, addr: &str) -> Result<(String, String), ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidAddr {
        addr: addr.to_owned(),
        reason: format!("a ring member's redirect: {reason}"),
    };
    if addr.contains("://") {
        return Err(invalid("expected host:port without a scheme"));
    }
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let uri = format!("{scheme}://{addr}");
    let parsed: tonic::codegen::http::Uri = uri
        .parse()
        .map_err(|e: tonic::codegen::http::uri::InvalidUri| invalid(&e.to_string()))?;
    let (Some(host), Some(_)) = (parsed.host(), parsed.port_u16()) else {
        return Err(invalid("expected host:port"));
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    Ok((uri, host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TlsFiles;
    use tonic::metadata::MetadataValue;

    fn owner(addr: &str) -> Owner {
        Owner {
            identity: format!("mgr-{addr}"),
            addr: addr.into(),
        }
    }

    #[test]
    fn three_redirects_in_a_row_are_followed_and_the_fourth_is_not() {
        let mut r = Redirects::default();
        assert_eq!(r.target(), None);
        for n in 1..=MAX_REDIRECTS {
            let to = owner(&format!("b:{n}"));
            assert_eq!(r.redirected(to.clone(), false), Follow::Dial(n));
            assert_eq!(r.target(), Some(&to));
        }
        assert_eq!(r.redirected(owner("b:4"), false), Follow::TooMany);
        assert_eq!(r.target(), None, "back to the configured address");
        // From the configured address the count starts again.
        assert_eq!(r.redirected(owner("b:5"), false), Follow::Dial(1));
    }

    #[test]
    fn registered_and_other_ends_reset_the_count() {
        let mut r = Redirects::default();
        r.redirected(owner("b:1"), false);
        r.redirected(owner("b:2"), false);
        // A session that registered at b:2 and then moved: the first redirect in a row.
        assert_eq!(r.redirected(owner("a:1"), true), Follow::Dial(1));
        r.redirected(owner("b:1"), false);
        r.back_to_configured();
        assert_eq!(r.target(), None);
        assert_eq!(r.redirected(owner("b:1"), false), Follow::Dial(1));
    }

    #[test]
    fn owners_come_from_rejected_revoked_and_trailers() {
        let rej = pb::Rejected {
            code: tonic::Code::Unavailable as i32,
            owner_identity: "mgr-1".into(),
            owner_address: "10.0.0.2:9090".into(),
            ..Default::default()
        };
        assert_eq!(
            Owner::from_rejected(&rej),
            Some(Owner {
                identity: "mgr-1".into(),
                addr: "10.0.0.2:9090".into()
            })
        );
        let other_code = pb::Rejected {
            code: tonic::Code::ResourceExhausted as i32,
            ..rej.clone()
        };
        assert_eq!(Owner::from_rejected(&other_code), None);
        let standby = pb::Rejected {
            owner_address: String::new(),
            ..rej
        };
        assert_eq!(Owner::from_rejected(&standby), None);

        let moved = pb::Revoked {
            reason: pb::revoked::Reason::UnitMoved as i32,
            code: tonic::Code::Unavailable as i32,
            leader_identity: "mgr-2".into(),
            owner_address: "mgr-2.ring:9090".into(),
            ..Default::default()
        };
        assert_eq!(
            Owner::from_revoked(&moved).map(|o| (o.identity, o.addr)),
            Some(("mgr-2".into(), "mgr-2.ring:9090".into()))
        );
        let not_yet_known = pb::Revoked {
            owner_address: String::new(),
            ..moved.clone()
        };
        assert_eq!(Owner::from_revoked(&not_yet_known), None);
        let lost = pb::Revoked {
            reason: pb::revoked::Reason::LeadershipLost as i32,
            ..moved
        };
        assert_eq!(Owner::from_revoked(&lost), None);

        let mut status = tonic::Status::unavailable("not the owner");
        let md = status.metadata_mut();
        md.insert(OWNER_TRAILER, MetadataValue::from_static("mgr-3"));
        md.insert(OWNER_ADDR_TRAILER, MetadataValue::from_static("[::1]:9091"));
        assert_eq!(
            Owner::from_status(&status).map(|o| (o.identity, o.addr)),
            Some(("mgr-3".into(), "[::1]:9091".into()))
        );
        assert_eq!(
            Owner::from_status(&tonic::Status::unavailable("standby")),
            None
        );
    }

    #[test]
    fn the_owner_is_dialled_with_the_configured_scheme_and_its_own_host_for_tls() {
        let plain = Config::new("http://ctrlhub.svc:9090", "t");
        assert_eq!(
            owner_uri(&plain, "10.0.0.2:9090").ok(),
            Some(("http://10.0.0.2:9090".into(), "10.0.0.2".into()))
        );
        let mut tls = Config::new("ctrlhub.svc:9090", "t");
        tls.tls = Some(TlsFiles {
            ca: "ca.pem".into(),
            cert: None,
            key: None,
            server_name: Some("ctrlhub.svc".into()),
        });
        assert_eq!(
            owner_uri(&tls, "mgr-1.ring.svc:9090").ok(),
            Some((
                "https://mgr-1.ring.svc:9090".into(),
                "mgr-1.ring.svc".into()
            ))
        );
        assert_eq!(
            owner_uri(&tls, "[::1]:9090").ok().map(|(_, host)| host),
            Some("::1".into())
        );
        for bad in ["http://10.0.0.2:9090", "no-port", "", "a b:1"] {
            assert!(
                matches!(owner_uri(&plain, bad), Err(ConfigError::InvalidAddr { .. })),
                "{bad:?}"
            );
        }
    }
}
