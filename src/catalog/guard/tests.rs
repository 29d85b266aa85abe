//! The shrink guard's rules: what is counted, when a smaller catalog is held back, and what a
//! confirmation approves.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::*;
use crate::fixtures::{MrmBuilder, MtBuilder, snapshot};

fn counts(release_metas: usize, templates: usize) -> CatalogCounts {
    CatalogCounts { release_metas, templates }
}

fn notes(recorded: Option<CatalogCounts>, confirmed: Option<CatalogCounts>) -> Option<LeaseNotes> {
    Some(LeaseNotes { recorded, confirmed })
}

/// A check with the default threshold (0.5) and a readable Lease without notes.
fn check(published: Option<CatalogCounts>, new: CatalogCounts) -> Check {
    Check { threshold: 0.5, published, notes: notes(None, None), new }
}

fn hold(reason: HoldReason, baseline: Option<CatalogCounts>, fraction: f64) -> Verdict {
    Verdict::Hold { reason, baseline, fraction }
}

// ---------------------------------------------------------------------------------------------
// What is counted
// ---------------------------------------------------------------------------------------------

#[test]
fn reachable_counts_what_some_kyma_gets() {
    let selected = LabelSelector {
        match_labels: Some([("region".to_owned(), "eu".to_owned())].into()),
        ..LabelSelector::default()
    };
    let mts = [
        MtBuilder::new("keda", "1.0.0").build(),
        MtBuilder::new("keda", "1.1.0").beta().build(),
        // No channel references it.
        MtBuilder::new("keda", "0.9.0").build(),
        MtBuilder::new("serverless", "1.0.0").internal().build(),
        MtBuilder::new("istio", "1.20.0").mandatory().build(),
        MtBuilder::new("secret", "1.0.0").build(),
        MtBuilder::new("unselected", "1.0.0").build(),
    ];
    let mrms = [
        MrmBuilder::new("keda").channel("regular", "1.0.0").channel("fast", "1.1.0").build(),
        MrmBuilder::new("serverless").channel("experimental", "1.0.0").build(),
        MrmBuilder::new("istio").mandatory("1.20.0").build(),
        MrmBuilder::new("secret").channel("regular", "1.0.0").selector(selected).build(),
        // Restricted, but without a selector.
        MrmBuilder::new("unselected").channel("regular", "1.0.0").build(),
        // No such template.
        MrmBuilder::new("orphan").channel("regular", "9.9.9").build(),
    ];
    let restricted: BTreeSet<String> = ["secret", "unselected"].map(String::from).into();
    assert_eq!(
        CatalogCounts::reachable(&snapshot(&mts, &mrms), &restricted),
        counts(3, 4),
        "keda, serverless and secret, with keda-1.0.0, keda-1.1.0, serverless-1.0.0 and secret-1.0.0"
    );
}

#[test]
fn deleting_every_release_meta_leaves_nothing_reachable() {
    let mts = [MtBuilder::new("keda", "1.0.0").build(), MtBuilder::new("btp", "1.0.0").build()];
    let snap = snapshot(&mts, &[]);
    assert_eq!(CatalogCounts::reachable(&snap, &BTreeSet::new()), counts(0, 0));
}

#[test]
fn counts_print_and_parse_as_the_lease_annotation() {
    assert_eq!(counts(3, 9).to_string(), "mrm=3,mt=9");
    assert_eq!("mrm=3,mt=9".parse(), Ok(counts(3, 9)));
    assert_eq!(" mt=9 , mrm=3 ".parse(), Ok(counts(3, 9)), "order and spaces do not matter");
    assert_eq!("mrm=0,mt=0".parse(), Ok(counts(0, 0)));
    for bad in
        ["", "3", "mrm=3", "mrm=3,mt=9,mt=9", "mrm=3,mt=-9", "mrm=3,mt=", "mrm=3;mt=9", "MRM=3,mt=9", "mrm=+3,mt=9"]
    {
        assert!(bad.parse::<CatalogCounts>().is_err(), "{bad:?} must not parse");
    }
}

#[test]
fn a_state_is_smaller_when_either_kind_has_fewer_objects() {
    assert!(counts(9, 30).is_smaller_than(&counts(10, 30)));
    assert!(counts(12, 29).is_smaller_than(&counts(10, 30)), "more modules, fewer versions");
    assert!(!counts(10, 30).is_smaller_than(&counts(10, 30)));
    assert!(!counts(11, 31).is_smaller_than(&counts(10, 30)));
}

#[test]
fn shrink_is_the_larger_loss_of_the_two_kinds() {
    assert_eq!(counts(10, 30).shrink_from(&counts(10, 30)), 0.0);
    assert_eq!(counts(12, 40).shrink_from(&counts(10, 30)), 0.0, "growth is no loss");
    assert_eq!(counts(10, 15).shrink_from(&counts(10, 30)), 0.5);
    assert_eq!(counts(2, 27).shrink_from(&counts(10, 30)), 0.8);
    assert_eq!(counts(0, 0).shrink_from(&counts(0, 0)), 0.0, "nothing to lose");
}

// ---------------------------------------------------------------------------------------------
// The decision
// ---------------------------------------------------------------------------------------------

#[test]
fn a_shrink_within_the_threshold_is_published() {
    for new in [counts(10, 30), counts(9, 27), counts(5, 15), counts(11, 33)] {
        assert_eq!(decide(&check(Some(counts(10, 30)), new)), Verdict::Publish(Publish::WithinThreshold), "{new}");
    }
}

#[test]
fn losing_more_than_the_threshold_of_either_kind_is_held() {
    let published = Some(counts(10, 30));
    assert_eq!(decide(&check(published, counts(0, 0))), hold(HoldReason::Shrink, published, 1.0));
    assert_eq!(decide(&check(published, counts(4, 30))), hold(HoldReason::Shrink, published, 0.6));
    assert_eq!(decide(&check(published, counts(10, 12))), hold(HoldReason::Shrink, published, 0.6));
}

#[test]
fn the_threshold_is_the_largest_loss_published_without_confirmation() {
    let at = |threshold| Check { threshold, ..check(Some(counts(10, 30)), counts(7, 21)) };
    assert_eq!(decide(&at(0.3)), Verdict::Publish(Publish::WithinThreshold), "exactly the threshold passes");
    assert!(matches!(decide(&at(0.2)), Verdict::Hold { reason: HoldReason::Shrink, .. }));
    assert!(matches!(decide(&at(0.0)), Verdict::Hold { .. }), "0 holds every loss");
    assert_eq!(
        decide(&Check { threshold: 0.0, ..check(Some(counts(10, 30)), counts(10, 31)) }),
        Verdict::Publish(Publish::WithinThreshold),
        "0 still publishes growth"
    );
}

#[test]
fn threshold_one_switches_the_guard_off() {
    for published in [None, Some(counts(10, 30))] {
        let c = Check { threshold: 1.0, notes: None, ..check(published, counts(0, 0)) };
        assert_eq!(decide(&c), Verdict::Publish(Publish::GuardOff));
    }
}

#[test]
fn a_confirmation_approves_exactly_the_counts_it_names() {
    let published = Some(counts(10, 30));
    let confirmed = |c| Check { notes: notes(None, Some(c)), ..check(published, counts(2, 6)) };
    assert_eq!(decide(&confirmed(counts(2, 6))), Verdict::Publish(Publish::Confirmed));
    for other in [counts(2, 7), counts(1, 6), counts(0, 0), counts(10, 30)] {
        assert_eq!(decide(&confirmed(other)), hold(HoldReason::Shrink, published, 0.8), "confirmed {other}");
    }
}

#[test]
fn a_replica_that_has_published_ignores_the_record() {
    // Its own history is the baseline; the record only stands in for it at a cold start.
    let c = Check { notes: notes(Some(counts(2, 6)), None), ..check(Some(counts(10, 30)), counts(2, 6)) };
    assert_eq!(decide(&c), hold(HoldReason::Shrink, Some(counts(10, 30)), 0.8));
    let c = Check { notes: notes(Some(counts(50, 150)), None), ..check(Some(counts(10, 30)), counts(10, 30)) };
    assert_eq!(decide(&c), Verdict::Publish(Publish::WithinThreshold));
}

#[test]
fn an_unreadable_lease_only_costs_a_published_replica_its_confirmation() {
    let c = Check { notes: None, ..check(Some(counts(10, 30)), counts(9, 27)) };
    assert_eq!(decide(&c), Verdict::Publish(Publish::WithinThreshold));
    let c = Check { notes: None, ..check(Some(counts(10, 30)), counts(2, 6)) };
    assert_eq!(decide(&c), hold(HoldReason::Shrink, Some(counts(10, 30)), 0.8));
}

// ---------------------------------------------------------------------------------------------
// Cold start: nothing published yet
// ---------------------------------------------------------------------------------------------

#[test]
fn a_cold_start_compares_with_the_recorded_catalog() {
    let recorded = |new| Check { notes: notes(Some(counts(10, 30)), None), ..check(None, new) };
    assert_eq!(decide(&recorded(counts(10, 30))), Verdict::Publish(Publish::WithinThreshold));
    assert_eq!(decide(&recorded(counts(6, 18))), Verdict::Publish(Publish::WithinThreshold));
    assert_eq!(
        decide(&recorded(counts(2, 6))),
        hold(HoldReason::Shrink, Some(counts(10, 30)), 0.8),
        "a replica started while the others hold holds too"
    );
    let confirmed = Check { notes: notes(Some(counts(10, 30)), Some(counts(2, 6))), ..check(None, counts(2, 6)) };
    assert_eq!(decide(&confirmed), Verdict::Publish(Publish::Confirmed));
}

#[test]
fn a_cold_start_without_a_record_holds_only_an_empty_catalog() {
    assert_eq!(decide(&check(None, counts(1, 1))), Verdict::Publish(Publish::WithinThreshold));
    assert_eq!(decide(&check(None, counts(0, 0))), hold(HoldReason::EmptyAtStart, None, 1.0));
    let confirmed = Check { notes: notes(None, Some(counts(0, 0))), ..check(None, counts(0, 0)) };
    assert_eq!(decide(&confirmed), Verdict::Publish(Publish::Confirmed));
}

#[test]
fn a_cold_start_that_cannot_read_the_lease_holds_whatever_it_sees() {
    for new in [counts(0, 0), counts(10, 30)] {
        let c = Check { notes: None, ..check(None, new) };
        assert_eq!(decide(&c), hold(HoldReason::LeaseUnreadable, None, 1.0), "{new}");
    }
}

#[test]
fn a_recorded_empty_catalog_is_a_baseline_like_any_other() {
    let c = Check { notes: notes(Some(counts(0, 0)), None), ..check(None, counts(0, 0)) };
    assert_eq!(decide(&c), Verdict::Publish(Publish::WithinThreshold));
}
