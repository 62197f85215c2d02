//! `hf:` downloads against a local stand-in of the Hugging Face hub (the same URL layout,
//! headers and redirects; frink_testdata::hub): a plain file, a redirect to a CDN-style
//! URL on another host (the token not sent there), a resumed interrupted download, a wrong
//! checksum (refused, nothing left in the store), a sharded model, a 401 without a token.

use frink_store::hf::{self, Hub, HubName};
use frink_store::StoreError;
use frink_testdata::hub::{HubStandIn, Repo};

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn name(s: &str) -> HubName {
    HubName::parse(s).unwrap().unwrap()
}

fn files(list: &[(&str, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    list.iter()
        .map(|(p, b)| (p.to_string(), b.clone()))
        .collect()
}

#[test]
fn a_plain_file_comes_through_the_redirect_and_is_not_fetched_twice() {
    let q4 = bytes(300_000, 1);
    let hub = HubStandIn::start(vec![(
        "org/plain",
        Repo {
            files: files(&[
                ("m-Q8_0.gguf", bytes(10, 2)),
                ("m-Q4_K_M.gguf", q4.clone()),
                ("README.md", b"hi".to_vec()),
            ]),
            token: Some("secret".into()),
            ..Repo::default()
        },
    )]);
    let root = tempfile::tempdir().unwrap();
    let client = Hub::new(&hub.endpoint, Some("secret"));
    let path = hf::pull(&client, root.path(), &name("hf:org/plain")).unwrap();
    assert!(
        path.ends_with("hf/org/plain/m-Q4_K_M.gguf"),
        "{}",
        path.display()
    );
    assert_eq!(std::fs::read(&path).unwrap(), q4);
    let seen = hub.seen();
    let resolve = seen.iter().find(|s| s.path.contains("/resolve/")).unwrap();
    assert!(resolve.authorized, "the hub gets the token");
    let cdn = seen.iter().find(|s| s.path.starts_with("/cdn/")).unwrap();
    assert!(!cdn.authorized, "the CDN host must not get the token");
    // Present now: a named file is not fetched again (no request at all).
    let n = hub.seen().len();
    let again = hf::pull(&client, root.path(), &name("hf:org/plain/m-Q4_K_M.gguf")).unwrap();
    assert_eq!(again, path);
    assert_eq!(hub.seen().len(), n);
    // The store lists it.
    let store = frink_store::Store::new(root.path().to_path_buf());
    assert!(store
        .list()
        .iter()
        .any(|m| m.name == "hf:org/plain/m-Q4_K_M.gguf"));
    assert_eq!(store.remove("hf:org/plain/m-Q4_K_M.gguf").unwrap().len(), 1);
    assert!(!path.exists());
}

#[test]
fn an_interrupted_download_resumes_with_a_range_request() {
    let data = bytes(1_000_000, 3);
    let hub = HubStandIn::start(vec![(
        "org/cut",
        Repo {
            files: files(&[("m-Q4_K_M.gguf", data.clone())]),
            cut_first_download: true,
            ..Repo::default()
        },
    )]);
    let root = tempfile::tempdir().unwrap();
    let client = Hub::new(&hub.endpoint, None);
    let e = hf::pull(&client, root.path(), &name("hf:org/cut")).unwrap_err();
    assert!(e.to_string().contains("resume"), "{e}");
    let partial = root.path().join("hf/org/cut/m-Q4_K_M.gguf.partial");
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(kept > 0 && kept < data.len() as u64, "{kept}");
    let path = hf::pull(&client, root.path(), &name("hf:org/cut")).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert!(!partial.exists());
    let ranged = hub
        .seen()
        .into_iter()
        .filter(|s| s.path.starts_with("/cdn/") && s.range.is_some())
        .collect::<Vec<_>>();
    assert_eq!(ranged.len(), 1, "{ranged:?}");
    assert_eq!(
        ranged[0].range.as_deref(),
        Some(format!("bytes={kept}-").as_str())
    );
}

#[test]
fn a_wrong_checksum_is_refused_and_leaves_nothing() {
    let hub = HubStandIn::start(vec![(
        "org/bad",
        Repo {
            files: files(&[("m-Q4_K_M.gguf", bytes(5000, 4))]),
            wrong_sha256: true,
            ..Repo::default()
        },
    )]);
    let root = tempfile::tempdir().unwrap();
    let e = hf::pull(
        &Hub::new(&hub.endpoint, None),
        root.path(),
        &name("hf:org/bad"),
    )
    .unwrap_err();
    assert!(matches!(e, StoreError::Sha256Mismatch { .. }), "{e}");
    let dir = root.path().join("hf/org/bad");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_sharded_model_is_fetched_whole_and_a_token_is_required_where_asked() {
    let shards: Vec<(String, Vec<u8>)> = (1..=3)
        .map(|k| {
            (
                format!("big/m-Q4_K_M-{k:05}-of-00003.gguf"),
                bytes(20_000 + k, k as u8),
            )
        })
        .collect();
    let hub = HubStandIn::start(vec![(
        "org/gated",
        Repo {
            files: shards.clone(),
            token: Some("tok".into()),
            ..Repo::default()
        },
    )]);
    let root = tempfile::tempdir().unwrap();
    let e = hf::pull(
        &Hub::new(&hub.endpoint, None),
        root.path(),
        &name("hf:org/gated"),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("401") && e.to_string().contains("HF_TOKEN"),
        "{e}"
    );
    let path = hf::pull(
        &Hub::new(&hub.endpoint, Some("tok")),
        root.path(),
        &name("hf:org/gated"),
    )
    .unwrap();
    assert!(path.ends_with("big/m-Q4_K_M-00001-of-00003.gguf"));
    for (p, b) in &shards {
        assert_eq!(
            &std::fs::read(root.path().join("hf/org/gated").join(p)).unwrap(),
            b
        );
    }
    let store = frink_store::Store::new(root.path().to_path_buf());
    let listed: Vec<String> = store.list().into_iter().map(|m| m.name).collect();
    assert_eq!(listed, ["hf:org/gated/big/m-Q4_K_M-00001-of-00003.gguf"]);
    assert_eq!(store.remove(&listed[0]).unwrap().len(), 3);
}

/// Every file under `dir`, recursively (paths relative to it).
/// The files under `dir`, but the pulls' lock files (`.locks/`, kept on purpose).
fn tree(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                if e.file_name() != ".locks" {
                    stack.push(p);
                }
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out
}

#[test]
fn a_listing_whose_paths_leave_the_store_is_refused_and_writes_nothing() {
    // Inside a scratch folder: the store is `scratch/store`; the listing aims at
    // `scratch/escaped.gguf` (dot segments) and at an absolute path in another folder.
    let scratch = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let root = scratch.path().join("store");
    let absolute = elsewhere.path().join("abs-Q4_K_M.gguf");
    let evil = |p: &str| {
        HubStandIn::start(vec![(
            "org/evil",
            Repo {
                files: files(&[(p, bytes(4096, 9))]),
                ..Repo::default()
            },
        )])
    };
    for listed in [
        "../../../../escaped-Q4_K_M.gguf".to_string(),
        "sub/../../../../../escaped-Q4_K_M.gguf".to_string(),
        absolute.display().to_string(),
        "./m-Q4_K_M.gguf".to_string(),
        "sub\\..\\..\\m-Q4_K_M.gguf".to_string(),
    ] {
        let hub = evil(&listed);
        let e = hf::pull(&Hub::new(&hub.endpoint, None), &root, &name("hf:org/evil")).unwrap_err();
        assert!(e.to_string().contains("leaves the store"), "{listed}: {e}");
        // Not a request for the file was made, and nothing was written anywhere.
        assert!(
            !hub.seen().iter().any(|s| !s.path.starts_with("/api/")),
            "{listed}: {:?}",
            hub.seen()
        );
        let written: Vec<String> = tree(scratch.path())
            .into_iter()
            .chain(tree(elsewhere.path()))
            .collect();
        assert!(written.is_empty(), "{listed}: {written:?}");
    }
}

#[test]
fn a_link_in_the_store_does_not_lead_a_download_out_of_it() {
    let hub = HubStandIn::start(vec![(
        "org/linked",
        Repo {
            files: files(&[("m-Q4_K_M.gguf", bytes(2048, 3))]),
            ..Repo::default()
        },
    )]);
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("hf/org")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("hf/org/linked")).unwrap();
    let e = hf::pull(
        &Hub::new(&hub.endpoint, None),
        root.path(),
        &name("hf:org/linked"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("outside the store"), "{e}");
    assert!(tree(outside.path()).is_empty());
}

#[test]
fn a_download_longer_than_its_listing_is_cut_and_removed() {
    let hub = HubStandIn::start(vec![(
        "org/long",
        Repo {
            files: files(&[("m-Q4_K_M.gguf", bytes(3 << 20, 5))]),
            understate_size: true,
            ..Repo::default()
        },
    )]);
    let root = tempfile::tempdir().unwrap();
    let e = hf::pull(
        &Hub::new(&hub.endpoint, None),
        root.path(),
        &name("hf:org/long"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("more than the"), "{e}");
    // Nothing of it stays (the bug left the whole oversized .partial file).
    assert!(tree(root.path()).is_empty(), "{:?}", tree(root.path()));
}

/// A listing whose only model is a split of zero shards names nothing to fetch: an error,
/// not a panic (it indexed an empty list).
#[test]
fn a_listing_of_zero_shards_is_an_error() {
    let hub = HubStandIn::start(vec![(
        "org/zero",
        Repo {
            files: files(&[("m-00001-of-00000.gguf", bytes(100, 3))]),
            ..Repo::default()
        },
    )]);
    let root = tempfile::tempdir().unwrap();
    let r = hf::pull(
        &Hub::new(&hub.endpoint, None),
        root.path(),
        &name("hf:org/zero"),
    );
    assert!(r.is_err(), "{r:?}");
}

/// Two pulls of one file under two names (`hf:o/r` and `hf:o/r:Q4_K_M`) at once, from two
/// threads: one downloads, the other waits for it; the file is whole and checks out.
#[test]
fn concurrent_pulls_of_one_file_take_turns() {
    let q4 = bytes(2_000_000, 5);
    let hub = HubStandIn::start(vec![(
        "org/two",
        Repo {
            files: files(&[("m-Q4_K_M.gguf", q4.clone())]),
            trickle: true,
            ..Repo::default()
        },
    )]);
    let root = tempfile::tempdir().unwrap();
    let paths: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ["hf:org/two", "hf:org/two:Q4_K_M"]
            .into_iter()
            .map(|n| {
                let (root, endpoint) = (root.path(), hub.endpoint.clone());
                s.spawn(move || hf::pull(&Hub::new(&endpoint, None), root, &name(n)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for p in &paths {
        let p = p.as_ref().unwrap();
        assert_eq!(std::fs::read(p).unwrap(), q4);
    }
}
