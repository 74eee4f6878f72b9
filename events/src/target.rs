//! Where a webhook may be delivered, and the client that delivers it.
//!
//! A subscription's URL is `https`, or `http` to a host the operator allowed
//! (`webhooks.allow_hosts`). No credentials in the URL. Its host must not be, or resolve to,
//! a loopback, private, link-local, shared, multicast or reserved address, unless the host is
//! allowed; the check is made when the URL is given ([`TargetPolicy::check`]) and again by the
//! client's own resolver at every connection ([`TargetPolicy::client`]), so a name that
//! resolves elsewhere later (DNS rebinding) is still refused. Redirects are not followed; an
//! attempt's time and the answer's bytes read are bounded.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;

use crate::signing::{headers, Secret};

/// The most bytes of a receiver's answer read (the rest is dropped unread).
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Why a URL may not receive webhooks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

impl Refused {
    /// The stable code of every refusal.
    pub const CODE: &'static str = "webhook_url_refused";
}

/// Which targets deliveries may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetPolicy {
    /// Hosts allowed over plain `http` and at any address (lowercase; names or IP literals).
    allow_hosts: Vec<String>,
}

impl TargetPolicy {
    /// A policy allowing `allow_hosts` besides public `https` targets.
    pub fn new(allow_hosts: &[String]) -> TargetPolicy {
        TargetPolicy {
            allow_hosts: allow_hosts
                .iter()
                .map(|host| host.trim().trim_matches(['[', ']']).to_ascii_lowercase())
                .filter(|host| !host.is_empty())
                .collect(),
        }
    }

    fn allowed_host(&self, host: &str) -> bool {
        let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
        self.allow_hosts.contains(&host)
    }

    /// Whether a delivery to `host` may connect to `address`.
    pub fn address_allowed(&self, host: &str, address: IpAddr) -> bool {
        self.allowed_host(host) || is_public(address)
    }

    /// Checks a subscription's URL; the parsed URL when it may receive webhooks.
    pub fn check(&self, url: &str) -> Result<Url, Refused> {
        let parsed =
            Url::parse(url).map_err(|error| Refused(format!("the URL does not parse: {error}")))?;
        let host = parsed
            .host_str()
            .ok_or_else(|| Refused("the URL names no host".to_owned()))?
            .to_owned();
        match parsed.scheme() {
            "https" => {}
            "http" if self.allowed_host(&host) => {}
            "http" => {
                return Err(Refused(format!(
                    "plain http to `{host}` is refused: use https, or allow the host in webhooks.allow_hosts"
                )))
            }
            other => return Err(Refused(format!("scheme `{other}` is refused: use https"))),
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(Refused(
                "credentials in the URL are refused: the receiver verifies the signature instead"
                    .to_owned(),
            ));
        }
        if parsed.fragment().is_some() {
            return Err(Refused("a fragment is never sent; leave it out".to_owned()));
        }
        if let Ok(address) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
            if !self.address_allowed(&host, address) {
                return Err(Refused(format!(
                    "`{address}` is a loopback, private, link-local or reserved address; allow the host in webhooks.allow_hosts to deliver there"
                )));
            }
        }
        Ok(parsed)
    }

    /// The client deliveries go through: this policy's resolver, no redirects, `timeout`
    /// per attempt.
    pub fn client(self: &Arc<Self>, timeout: Duration) -> Result<reqwest::Client, String> {
        reqwest::Client::builder()
            .dns_resolver(Arc::new(CheckedResolver {
                policy: self.clone(),
            }))
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .pool_max_idle_per_host(64)
            .user_agent(concat!("cairn-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| format!("the webhook client: {error}"))
    }
}

/// Resolves a name and keeps only the addresses the policy lets a delivery reach.
struct CheckedResolver {
    policy: Arc<TargetPolicy>,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let kept: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|address| policy.address_allowed(&host, address.ip()))
                .collect();
            if kept.is_empty() {
                let error: Box<dyn std::error::Error + Send + Sync> = Box::new(Refused(format!(
                    "`{host}` resolves only to addresses webhooks may not reach ({})",
                    found
                        .iter()
                        .map(|address| address.ip().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
                return Err(error);
            }
            let addresses: Addrs = Box::new(kept.into_iter());
            Ok(addresses)
        })
    }
}

/// Whether an address is on the public internet: not loopback, private, link-local, shared
/// (CGNAT), multicast, broadcast, documentation, benchmarking or reserved; an IPv4 address
/// inside IPv6 (mapped or NAT64) is judged as IPv4.
pub fn is_public(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(address: Ipv4Addr) -> bool {
    let [a, b, c, _] = address.octets();
    !(address.is_unspecified()
        || address.is_loopback()
        || address.is_private()
        || address.is_link_local()
        || address.is_broadcast()
        || address.is_multicast()
        || address.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240)
}

fn is_public_v6(address: Ipv6Addr) -> bool {
    if let Some(v4) = address.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let segments = address.segments();
    // NAT64 (64:ff9b::/96) carries an IPv4 address in its last 32 bits.
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [.., high, low] = segments;
        let v4 = Ipv4Addr::from((u32::from(high) << 16) | u32::from(low));
        return is_public_v4(v4);
    }
    !(address.is_unspecified()
        || address.is_loopback()
        || address.is_multicast()
        || (segments[0] & 0xfe00) == 0xfc00
        || (segments[0] & 0xffc0) == 0xfe80
        || (segments[0] & 0xffc0) == 0xfec0
        || (segments[0] == 0x2001 && segments[1] == 0x0db8))
}

/// How one delivery attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The receiver answered 2xx.
    Delivered(u16),
    /// The receiver answered 410: it wants no more (the subscription is disabled).
    Gone,
    /// Anything else: another status (a redirect included, never followed), a refused or
    /// failed connection, a timeout. Retried later.
    Failed {
        /// The receiver's status, when it answered.
        status: Option<u16>,
        /// Why, for the operator.
        reason: String,
    },
}

/// Sends one signed delivery of `body` to `url` with `client` (from [`TargetPolicy::client`]).
pub async fn deliver(
    client: &reqwest::Client,
    url: &Url,
    secrets: &[Secret],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Outcome {
    let mut request = client
        .post(url.clone())
        .header("content-type", "application/json")
        .body(body.to_vec());
    for (name, value) in headers(secrets, id, timestamp, body) {
        request = request.header(name, value);
    }
    let mut response = match request.send().await {
        Ok(response) => response,
        Err(error) => {
            return Outcome::Failed {
                status: None,
                reason: describe(&error),
            }
        }
    };
    let status = response.status().as_u16();
    // Read a bounded part of the answer, so the connection can be reused; drop the rest.
    let mut read = 0usize;
    while read < MAX_ANSWER_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => read += chunk.len(),
            _ => break,
        }
    }
    match status {
        200..=299 => Outcome::Delivered(status),
        410 => Outcome::Gone,
        _ => Outcome::Failed {
            status: Some(status),
            reason: format!("the receiver answered {status}"),
        },
    }
}

/// A delivery error in words, with the resolver's refusal when that is why.
fn describe(error: &reqwest::Error) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if let Some(refused) = current.downcast_ref::<Refused>() {
            return refused.0.clone();
        }
        source = current.source();
    }
    if error.is_timeout() {
        "the receiver did not answer in time".to_owned()
    } else if error.is_connect() {
        "the receiver could not be reached".to_owned()
    } else {
        format!("the delivery failed: {error}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_public_or_not() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "198.18.0.1",
            "192.0.2.1",
            "240.0.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2001:db8::1",
            "ff02::1",
        ] {
            let address: IpAddr = private.parse().expect(private);
            assert!(!is_public(address), "{private} must not be public");
        }
        for public in [
            "93.184.216.34",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            let address: IpAddr = public.parse().expect(public);
            assert!(is_public(address), "{public} is public");
        }
    }

    #[test]
    fn urls_are_checked() {
        let policy = TargetPolicy::new(&["hooks.internal".to_owned(), "127.0.0.1".to_owned()]);
        policy
            .check("https://example.com/hook")
            .expect("public https");
        policy
            .check("http://hooks.internal/x")
            .expect("an allowed host over http");
        policy
            .check("http://127.0.0.1:9000/x")
            .expect("an allowed address");
        for (url, needle) in [
            ("http://example.com/hook", "plain http"),
            ("ftp://example.com/hook", "scheme"),
            ("https://user:pw@example.com/hook", "credentials"),
            (
                "https://169.254.169.254/latest/meta-data",
                "169.254.169.254",
            ),
            ("https://[::1]/x", "::1"),
            ("https://10.0.0.5/x", "10.0.0.5"),
            ("https://example.com/hook#frag", "fragment"),
            ("not a url", "parse"),
        ] {
            let refused = policy.check(url).expect_err(url);
            assert!(refused.0.contains(needle), "{url}: {refused}");
        }
    }
}
