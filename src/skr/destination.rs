//! Where an SKR apiserver may be (`--skr-allowed-destinations`), decided per address (pure).
//!
//! An access Secret names the server catalogsync connects to, with the SKR's credentials and
//! from inside the KCP network. Without a rule, a Secret could point a replica at the cloud
//! metadata service, the KCP apiserver, or anything else on the pod network. The rule:
//!
//! - An address is allowed when `public` is listed and the address is public (not loopback,
//!   private, shared (CGNAT), link-local, unspecified, multicast, documentation or reserved),
//!   or when a listed CIDR contains it.
//! - A DNS name that ends in a listed suffix may resolve to any address except the ones that
//!   are never an SKR (loopback, link-local, unspecified, multicast), unless a listed CIDR
//!   contains it. Other names must resolve only to allowed addresses.
//! - The KCP apiserver's own addresses are never allowed.
//!
//! Names are resolved once per sync and the connection goes to exactly the addresses that
//! were checked (see [`crate::skr::access`]), so a name cannot be re-resolved elsewhere
//! between the check and the connect.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// An IP network, `address/prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` lies in this network (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// An entry of `--skr-allowed-destinations` that does not parse; the message quotes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// No `/` between address and prefix.
    #[error("{0:?} is not a CIDR (address/prefix)")]
    CidrShape(String),
    /// The address of a CIDR does not parse.
    #[error("{0:?} is not a CIDR: bad address")]
    CidrAddress(String),
    /// The prefix of a CIDR does not parse or is too long for the address.
    #[error("{0:?} is not a CIDR: bad prefix")]
    CidrPrefix(String),
    /// A DNS suffix with an invalid label.
    #[error("{0:?} is not a DNS suffix")]
    Suffix(String),
    /// Neither `public`, a CIDR nor a DNS suffix.
    #[error("{0:?} is not `public`, a CIDR (10.250.0.0/16) or a DNS suffix starting with a dot (.example.com)")]
    Unknown(String),
}

impl FromStr for Cidr {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Self, RuleError> {
        let (addr, prefix) = s.split_once('/').ok_or_else(|| RuleError::CidrShape(s.to_owned()))?;
        let addr: IpAddr = addr.parse().map_err(|_| RuleError::CidrAddress(s.to_owned()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 =
            prefix.parse().ok().filter(|p| *p <= max).ok_or_else(|| RuleError::CidrPrefix(s.to_owned()))?;
        Ok(Self { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// One entry of `--skr-allowed-destinations`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// `public`: any public address.
    Public,
    /// A CIDR such as `10.250.0.0/16`.
    Cidr(Cidr),
    /// A DNS suffix such as `.example.com` (matches `a.example.com`, not `example.com`).
    Suffix(String),
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Self, RuleError> {
        let s = s.trim();
        if s == "public" {
            Ok(Rule::Public)
        } else if s.contains('/') {
            s.parse().map(Rule::Cidr)
        } else if let Some(domain) = s.strip_prefix('.') {
            let domain = domain.trim_end_matches('.').to_ascii_lowercase();
            let valid = !domain.is_empty()
                && domain.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                });
            if valid { Ok(Rule::Suffix(format!(".{domain}"))) } else { Err(RuleError::Suffix(s.to_owned())) }
        } else {
            Err(RuleError::Unknown(s.to_owned()))
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Public => f.write_str("public"),
            Rule::Cidr(c) => c.fmt(f),
            Rule::Suffix(s) => f.write_str(s),
        }
    }
}

/// What kind of address was refused: the message says this, not the address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// 169.254.0.0/16 (with the cloud metadata service), fe80::/10.
    LinkLocal,
    /// 0.0.0.0, ::.
    Unspecified,
    /// Multicast and broadcast.
    Multicast,
    /// RFC 1918, shared (CGNAT) and unique-local addresses.
    Private,
    /// Documentation, benchmarking and reserved ranges.
    Reserved,
    /// The KCP apiserver.
    Kcp,
    /// A public address while `public` is not listed.
    NotListed,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::Loopback => "a loopback address",
            Refusal::LinkLocal => "a link-local address (such as the cloud metadata service)",
            Refusal::Unspecified => "an unspecified address",
            Refusal::Multicast => "a multicast or broadcast address",
            Refusal::Private => "a private address",
            Refusal::Reserved => "a reserved address",
            Refusal::Kcp => "the KCP apiserver",
            Refusal::NotListed => "an address",
        })
    }
}

/// The allowed SKR destinations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destinations {
    rules: Vec<Rule>,
    denied: Vec<SocketAddr>,
}

impl Default for Destinations {
    /// `public` only.
    fn default() -> Self {
        Self { rules: vec![Rule::Public], denied: Vec::new() }
    }
}

impl Destinations {
    /// The destinations of `rules`.
    pub fn new(rules: Vec<Rule>) -> Self {
        Self { rules, denied: Vec::new() }
    }

    /// Never allows `addrs` (the KCP apiserver), whatever the rules say.
    #[must_use]
    pub fn deny(mut self, addrs: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.denied.extend(addrs.into_iter().map(|a| SocketAddr::new(canonical(a.ip()), a.port())));
        self
    }

    /// The rules, for logs and docs.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Whether `name` ends in a listed DNS suffix.
    pub fn trusts_name(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.rules.iter().any(|r| matches!(r, Rule::Suffix(s) if name.ends_with(s.as_str())))
    }

    /// Whether the server may be at `addr`; `trusted_name` when it was reached through a
    /// name that ends in a listed suffix.
    ///
    /// # Errors
    /// The kind of address refused.
    pub fn check(&self, addr: SocketAddr, trusted_name: bool) -> Result<(), Refusal> {
        let ip = canonical(addr.ip());
        if self.denied.contains(&SocketAddr::new(ip, addr.port())) {
            return Err(Refusal::Kcp);
        }
        if self.rules.iter().any(|r| matches!(r, Rule::Cidr(c) if c.contains(ip))) {
            return Ok(());
        }
        match classify(ip) {
            None if self.rules.contains(&Rule::Public) => Ok(()),
            None if trusted_name => Ok(()),
            None => Err(Refusal::NotListed),
            Some(Refusal::Private | Refusal::Reserved) if trusted_name => Ok(()),
            Some(refusal) => Err(refusal),
        }
    }
}

/// An IPv4-mapped IPv6 address as IPv4; everything else unchanged.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// What is special about `ip`, or `None` for a public address.
fn classify(ip: IpAddr) -> Option<Refusal> {
    match canonical(ip) {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u8) -> bool {
    Cidr { addr: IpAddr::V4(Ipv4Addr::from(net)), prefix }.contains(IpAddr::V4(ip))
}

fn classify_v4(ip: Ipv4Addr) -> Option<Refusal> {
    if ip.is_loopback() {
        Some(Refusal::Loopback)
    } else if ip.is_link_local() {
        Some(Refusal::LinkLocal)
    } else if ip.is_unspecified() || in_v4(ip, [0, 0, 0, 0], 8) {
        Some(Refusal::Unspecified)
    } else if ip.is_multicast() || ip.is_broadcast() {
        Some(Refusal::Multicast)
    } else if ip.is_private() || in_v4(ip, [100, 64, 0, 0], 10) {
        Some(Refusal::Private)
    } else if ip.is_documentation()
        || in_v4(ip, [192, 0, 0, 0], 24)
        || in_v4(ip, [198, 18, 0, 0], 15)
        || in_v4(ip, [240, 0, 0, 0], 4)
    {
        Some(Refusal::Reserved)
    } else {
        None
    }
}

fn classify_v6(ip: Ipv6Addr) -> Option<Refusal> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some(Refusal::Loopback)
    } else if ip.is_unspecified() {
        Some(Refusal::Unspecified)
    } else if ip.is_multicast() {
        Some(Refusal::Multicast)
    } else if first & 0xffc0 == 0xfe80 {
        Some(Refusal::LinkLocal)
    } else if first & 0xfe00 == 0xfc00 {
        Some(Refusal::Private)
    } else if first == 0x2001 && ip.segments()[1] == 0x0db8 {
        Some(Refusal::Reserved)
    } else if ip.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // NAT64: judged by the IPv4 address it carries.
        let [.., a, b] = ip.segments();
        classify_v4(Ipv4Addr::from((u32::from(a) << 16) | u32::from(b)))
    } else if first == 0x2002 {
        // 6to4: judged by the IPv4 address it carries.
        let [_, a, b, ..] = ip.segments();
        classify_v4(Ipv4Addr::from((u32::from(a) << 16) | u32::from(b)))
    } else if ip.to_ipv4().is_some() {
        // IPv4-compatible (deprecated) and other embedded forms: never an SKR.
        Some(Refusal::Reserved)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        SocketAddr::new(s.parse().expect("an IP"), 443)
    }

    fn rules(list: &[&str]) -> Destinations {
        Destinations::new(list.iter().map(|r| r.parse().expect("a rule")).collect())
    }

    #[test]
    fn the_default_allows_public_addresses_only() {
        let d = Destinations::default();
        for ok in ["8.8.8.8", "52.1.2.3", "2a00:1450::1", "::ffff:8.8.8.8"] {
            assert_eq!(d.check(addr(ok), false), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("127.0.0.1", Refusal::Loopback),
            ("127.255.0.9", Refusal::Loopback),
            ("::1", Refusal::Loopback),
            ("::ffff:127.0.0.1", Refusal::Loopback),
            ("169.254.169.254", Refusal::LinkLocal),
            ("fe80::1", Refusal::LinkLocal),
            ("0.0.0.0", Refusal::Unspecified),
            ("0.1.2.3", Refusal::Unspecified),
            ("::", Refusal::Unspecified),
            ("10.0.0.1", Refusal::Private),
            ("172.16.5.5", Refusal::Private),
            ("192.168.1.1", Refusal::Private),
            ("100.64.0.1", Refusal::Private),
            ("fd00:ec2::254", Refusal::Private),
            ("224.0.0.1", Refusal::Multicast),
            ("255.255.255.255", Refusal::Multicast),
            ("ff02::1", Refusal::Multicast),
            ("192.0.2.1", Refusal::Reserved),
            ("198.18.0.1", Refusal::Reserved),
            ("240.0.0.1", Refusal::Reserved),
            ("2001:db8::1", Refusal::Reserved),
            ("64:ff9b::a9fe:a9fe", Refusal::LinkLocal),
            ("2002:a9fe:a9fe::1", Refusal::LinkLocal),
            ("2002:0a00:0001::1", Refusal::Private),
        ] {
            assert_eq!(d.check(addr(bad), false), Err(why), "{bad}");
            // A trusted name does not open loopback, link-local, unspecified or multicast.
            if !matches!(why, Refusal::Private | Refusal::Reserved) {
                assert_eq!(d.check(addr(bad), true), Err(why), "{bad} through a trusted name");
            }
        }
    }

    #[test]
    fn cidrs_open_exactly_their_range() {
        let d = rules(&["127.0.0.1/32", "10.250.0.0/16", "fd00::/8"]);
        assert_eq!(d.check(addr("127.0.0.1"), false), Ok(()));
        assert_eq!(d.check(addr("127.0.0.2"), false), Err(Refusal::Loopback));
        assert_eq!(d.check(addr("10.250.3.4"), false), Ok(()));
        assert_eq!(d.check(addr("10.251.0.1"), false), Err(Refusal::Private));
        assert_eq!(d.check(addr("fd12::1"), false), Ok(()));
        assert_eq!(d.check(addr("8.8.8.8"), false), Err(Refusal::NotListed), "public is not listed");
        assert_eq!(rules(&["0.0.0.0/0"]).check(addr("169.254.169.254"), false), Ok(()), "an explicit CIDR wins");
    }

    #[test]
    fn suffixes_trust_names_not_addresses() {
        let d = rules(&[".skr.example.com"]);
        assert!(d.trusts_name("api.skr.example.com"));
        assert!(d.trusts_name("API.SKR.example.com."));
        assert!(!d.trusts_name("skr.example.com"), "the suffix starts with a dot");
        assert!(!d.trusts_name("evilskr.example.com"));
        assert_eq!(d.check(addr("10.1.2.3"), true), Ok(()), "a trusted name may be private");
        assert_eq!(d.check(addr("10.1.2.3"), false), Err(Refusal::Private));
        assert_eq!(d.check(addr("8.8.8.8"), false), Err(Refusal::NotListed));
    }

    #[test]
    fn the_kcp_is_never_allowed() {
        let kcp = addr("127.0.0.1");
        let d = rules(&["127.0.0.0/8", "public"]).deny([kcp]);
        assert_eq!(d.check(kcp, false), Err(Refusal::Kcp));
        assert_eq!(d.check(SocketAddr::new(kcp.ip(), 6443), false), Ok(()), "another port is another server");
        assert_eq!(d.check(addr("::ffff:127.0.0.1"), true), Err(Refusal::Kcp));
    }

    #[test]
    fn rules_parse_or_explain() {
        assert_eq!("public".parse::<Rule>(), Ok(Rule::Public));
        assert_eq!(".Example.COM".parse::<Rule>(), Ok(Rule::Suffix(".example.com".into())));
        assert!(matches!("10.0.0.0/8".parse::<Rule>(), Ok(Rule::Cidr(_))));
        for bad in ["example.com", "10.0.0.0/33", "10.0.0/8", ".", ".-a.com", "::/129", "any", ""] {
            assert!(bad.parse::<Rule>().is_err(), "{bad}");
        }
    }
}
