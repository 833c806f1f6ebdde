use std::time::Duration;

use super::*;

fn shares(busy: usize, default_share: usize) -> FairShares {
    FairShares::new(ShareSettings {
        busy,
        default_share,
        default_rate: 0,
        retry_after_secs: 60,
    })
}

#[test]
fn a_lone_source_is_not_held_to_its_share_however_busy_the_process_is() {
    let shares = shares(8, 2);
    let source = SourceShare::new(None, None);
    // Busy from the eighth on, and past its share: alone, it is taken in.
    let places: Vec<Place> = (0..20)
        .map(|_| shares.try_admit(&source).unwrap())
        .collect();
    assert_eq!(shares.in_flight(), 20);
    // A newcomer is taken in within its share, and from then on the
    // lone source is held to twice what the newcomer holds.
    let newcomer = SourceShare::new(None, None);
    let first = shares.try_admit(&newcomer).unwrap();
    assert_eq!(shares.try_admit(&source).err(), Some(OverShare));
    drop((places, first));
    assert_eq!(shares.in_flight(), 0);
    assert!(shares.try_admit(&source).is_ok());
}

/// A merchant sending one sale at a time is rarely in flight when a
/// flood's delivery arrives: it protects it for [`RECENT`] after its
/// last delivery ended, and then no longer.
#[tokio::test(start_paused = true)]
async fn a_source_between_two_deliveries_still_holds_a_flood_to_its_share() {
    let shares = shares(4, 2);
    let (flood, quiet) = (SourceShare::new(None, None), SourceShare::new(None, None));
    drop(shares.try_admit(&quiet).unwrap());
    tokio::time::advance(RECENT / 2).await;
    let flooding: Vec<Place> = std::iter::from_fn(|| shares.try_admit(&flood).ok())
        .take(100)
        .collect();
    assert_eq!(flooding.len(), 4, "its share and two borrowed until busy");
    // Gone quiet for longer than RECENT: the flood is alone again.
    tokio::time::advance(RECENT).await;
    assert!(shares.try_admit(&flood).is_ok());
}

/// Small merchants sending now and then are active, holding nothing
/// in flight; two equal big sources behind a slow broker are not held
/// for being far above their average: the busiest other is the measure.
#[tokio::test(start_paused = true)]
async fn equal_sources_beside_small_merchants_are_not_held_to_their_shares() {
    let shares = shares(8, 2);
    let small: Vec<SourceShare> = (0..10).map(|_| SourceShare::new(None, None)).collect();
    for merchant in &small {
        drop(shares.try_admit(merchant).unwrap());
    }
    let (a, b) = (SourceShare::new(None, None), SourceShare::new(None, None));
    let mut places = Vec::new();
    for _round in 0..20 {
        for source in [&a, &b] {
            places.push(shares.try_admit(source).expect("an equal source refused"));
        }
    }
    assert_eq!(shares.in_flight(), 40);
}

#[test]
fn a_source_within_its_share_is_taken_in_however_busy_the_process_is() {
    let shares = shares(4, 2);
    let (flood, quiet) = (SourceShare::new(None, None), SourceShare::new(None, None));
    let first = shares.try_admit(&quiet).unwrap();
    let flooding: Vec<Place> = std::iter::from_fn(|| shares.try_admit(&flood).ok())
        .take(100)
        .collect();
    // Its share and one borrowed before the process turned busy; then
    // it holds 3, past twice the quiet source's 1: over its share.
    assert_eq!(flooding.len(), 3);
    assert_eq!(shares.in_flight(), 4);
    // The quiet source's own share is taken in however busy it is...
    let second = shares.try_admit(&quiet).unwrap();
    // ...and past it, holding less than the flood, it borrows until it
    // holds twice as much.
    let more: Vec<Place> = std::iter::from_fn(|| shares.try_admit(&quiet).ok())
        .take(100)
        .collect();
    assert_eq!(
        more.len(),
        4,
        "2 of its share + 4 borrowed = 2 × the flood's 3"
    );
    drop((first, second, more));
    // A slot of the flood's own share comes free: it may take one more.
    drop(flooding);
    assert!(shares.try_admit(&flood).is_ok());
}

/// A slow broker keeps every source's deliveries in flight longer: the
/// process turns busy with no merchant flooding, and equal sources are
/// not refused (a Mekari source would have been answered 429 and spent
/// one of its attempts on every delivery past its share).
#[test]
fn equal_sources_behind_a_slow_broker_are_not_held_to_their_shares() {
    let shares = shares(8, 2);
    let sources: Vec<SourceShare> = (0..4).map(|_| SourceShare::new(None, None)).collect();
    let mut places = Vec::new();
    for _round in 0..10 {
        for source in &sources {
            places.push(shares.try_admit(source).expect("an equal source refused"));
        }
    }
    assert_eq!(shares.in_flight(), 40);
    // One of them sending far more than the others is held, though.
    let flood = &sources[0];
    let flooding: Vec<Place> = std::iter::from_fn(|| shares.try_admit(flood).ok())
        .take(100)
        .collect();
    assert_eq!(flooding.len(), 10, "up to twice the others' 10 each");
    assert_eq!(shares.try_admit(flood).err(), Some(OverShare));
}

#[test]
fn a_source_s_own_setting_replaces_the_default_share() {
    let shares = shares(0, 2);
    // Another source in flight: a source alone is not held at all.
    let other = shares.try_admit(&SourceShare::new(None, None)).unwrap();
    let big = SourceShare::new(Some(5), None);
    let places: Vec<Place> = std::iter::from_fn(|| shares.try_admit(&big).ok())
        .take(100)
        .collect();
    assert_eq!(places.len(), 5);
    // A share of 0 would refuse every delivery: it is at least 1.
    let zero = SourceShare::new(Some(0), None);
    assert!(shares.try_admit(&zero).is_ok());
    drop(other);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_delivery_gets_the_first_slot_that_comes_free_or_none() {
    let shares = shares(0, 1);
    let source = SourceShare::new(None, None);
    let first = shares.try_admit(&source).unwrap();
    let waiting = {
        let shares = shares.clone();
        let source = source.clone();
        tokio::spawn(async move {
            shares
                .wait_for(&source, Instant::now() + Duration::from_secs(3))
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(first);
    let place = waiting.await.unwrap().expect("the slot that came free");
    // Nothing comes free now: the wait runs out.
    let started = Instant::now();
    let none = shares
        .wait_for(&source, Instant::now() + Duration::from_secs(3))
        .await;
    assert!(none.is_none());
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!(shares.in_flight(), 1);
    let over = shares.take_anyway(&source);
    assert_eq!(shares.in_flight(), 2);
    drop((place, over));
    assert_eq!(shares.in_flight(), 0);
}

fn paced(default_rate: u32) -> FairShares {
    FairShares::new(ShareSettings {
        busy: 64,
        default_share: 16,
        default_rate,
        retry_after_secs: 60,
    })
}

/// The wait a delivery has for its slot in these tests.
const WAIT: Duration = Duration::from_secs(3);

fn pace_now(shares: &FairShares, source: &SourceShare) -> Paced {
    let now = Instant::now();
    shares.pace(source, now, now + WAIT)
}

/// `count` deliveries of `source` at once, none of them paced.
fn never_paced(shares: &FairShares, source: &SourceShare, count: usize) {
    for n in 0..count {
        assert_eq!(pace_now(shares, source), Paced::Now, "delivery {n}");
    }
}

/// A merchant replaying its day beside one selling at its rate: past a
/// burst at its rate it is paced to it, a slot each interval, until the
/// slots lie past the wait; the other goes on at once.
#[tokio::test(start_paused = true)]
async fn a_source_sending_far_more_than_the_others_is_paced_and_they_are_not() {
    let shares = paced(100);
    let (flood, quiet) = (SourceShare::new(None, None), SourceShare::new(None, None));
    assert_eq!(pace_now(&shares, &quiet), Paced::Now);
    let start = Instant::now();
    let paces: Vec<Paced> = (0..500).map(|_| pace_now(&shares, &flood)).collect();
    // A burst of 100 ms at its rate at once: the one due now and ten more.
    assert!(paces[..11].iter().all(|p| *p == Paced::Now), "{paces:?}");
    assert_eq!(paces[11], Paced::Until(start + Duration::from_millis(10)));
    assert_eq!(paces[310], Paced::Until(start + Duration::from_secs(3)));
    assert!(
        paces[311..].iter().all(|p| *p == Paced::Over),
        "past the wait"
    );
    assert_eq!(pace_now(&shares, &quiet), Paced::Now);
    // Its slots caught up with, it goes on at its pace.
    tokio::time::advance(Duration::from_secs(4)).await;
    assert_eq!(pace_now(&shares, &flood), Paced::Now);
}

/// Two sources sending alike, thousands a second each, are never paced:
/// neither sends twice what the other does. Nor is a source alone.
#[tokio::test(start_paused = true)]
async fn sources_sending_alike_and_a_source_alone_are_not_paced() {
    let shares = paced(100);
    let (a, b) = (SourceShare::new(None, None), SourceShare::new(None, None));
    for _ms in 0..1500 {
        tokio::time::advance(Duration::from_millis(1)).await;
        for source in [&a, &b, &a, &b] {
            assert_eq!(pace_now(&shares, source), Paced::Now);
        }
    }
    never_paced(&paced(100), &SourceShare::new(None, None), 5000);
}

/// The pace is the busiest other's rate twice over when that is above the
/// source's own; a source's `max_per_second` replaces the default; and a
/// default of 0 paces no source.
#[tokio::test(start_paused = true)]
async fn the_pace_is_the_larger_of_the_source_s_rate_and_twice_the_busiest_other_s() {
    let shares = paced(100);
    let (flood, other) = (SourceShare::new(None, None), SourceShare::new(None, None));
    never_paced(&shares, &other, 300);
    // A look at the rates serves 10 ms: the flood's is its own.
    tokio::time::advance(RATE_LOOK).await;
    let start = Instant::now();
    let paces: Vec<Paced> = (0..700).map(|_| pace_now(&shares, &flood)).collect();
    // Not paced while it sends less than twice the other's 300 a second
    // (bursts of 100 ms at its rate, then a look); from the 600th on, paced
    // to 600 a second, from the end of its last burst.
    let first = paces.iter().position(|p| *p != Paced::Now).unwrap();
    assert_eq!(first, 599);
    assert_eq!(paces[599], Paced::Until(start + Duration::from_millis(10)));
    assert_eq!(
        paces[600],
        Paced::Until(start + Duration::from_micros(11_666))
    );

    let shares = paced(100);
    let (own, quiet) = (
        SourceShare::new(None, Some(1000)),
        SourceShare::new(None, None),
    );
    assert_eq!(pace_now(&shares, &quiet), Paced::Now);
    let start = Instant::now();
    let paces: Vec<Paced> = (0..200).map(|_| pace_now(&shares, &own)).collect();
    assert!(
        paces[..101].iter().all(|p| *p == Paced::Now),
        "a burst at its own rate"
    );
    assert_eq!(paces[101], Paced::Until(start + Duration::from_millis(1)));

    let unpaced = paced(0);
    let (flood, other) = (SourceShare::new(None, None), SourceShare::new(None, None));
    never_paced(&unpaced, &other, 1);
    never_paced(&unpaced, &flood, 5000);
}
