//! What `GET /admin/sources` and the status page show of the sources: every
//! source in use and every refused file, with why.

use std::collections::BTreeMap;
use std::sync::PoisonError;

use super::{Key, Sources};
use crate::http::status::{Origin, RefusedFile, SourceView, SourcesReport};

impl Sources {
    /// Every source, the refused files' too, in provider and name order,
    /// and the files refused without a directory source to show them under.
    pub fn report(&self) -> SourcesReport {
        SourcesReport {
            sources: self.views(),
            refused_files: self.unsourced_refusals(),
        }
    }

    fn views(&self) -> Vec<SourceView> {
        let live = self.live.load();
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut views: BTreeMap<Key, SourceView> = BTreeMap::new();
        for (key, webhook) in live.iter() {
            let loaded = state.loaded.get(key);
            views.insert(
                key.clone(),
                SourceView {
                    provider: key.0,
                    name: key.1.clone(),
                    account: webhook.source.account.clone(),
                    origin: loaded.map_or(Origin::MainFile, |l| Origin::File {
                        path: l.file.path.clone(),
                    }),
                    serving: true,
                    loaded_at: Some(loaded.map_or(self.started, |l| l.at)),
                    refused: None,
                },
            );
        }
        for refusal in state.refused.values() {
            // A file named like a main-file source is not that source's:
            // it is shown apart ([`Sources::unsourced_refusals`]).
            let Some(key) = refusal
                .source
                .as_ref()
                .filter(|k| !self.main.contains_key(*k))
            else {
                continue;
            };
            let view = views.entry(key.clone()).or_insert_with(|| SourceView {
                provider: key.0,
                name: key.1.clone(),
                account: None,
                origin: Origin::File {
                    path: refusal.path.clone(),
                },
                serving: false,
                loaded_at: None,
                refused: None,
            });
            view.refused = Some(refusal.reason.clone());
        }
        views.into_values().collect()
    }

    /// The refused files without a directory source to show them under (a
    /// file named wrongly, or named like a main-file source), and why the
    /// directory cannot be read, when it cannot.
    fn unsourced_refusals(&self) -> Vec<RefusedFile> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .refused
            .values()
            .filter(|r| r.source.as_ref().is_none_or(|k| self.main.contains_key(k)))
            .map(|r| RefusedFile {
                path: r.path.clone(),
                reason: r.reason.clone(),
            })
            .chain(state.unreadable.iter().map(|why| RefusedFile {
                path: self.dir.clone().unwrap_or_default(),
                reason: why.clone(),
            }))
            .collect()
    }
}
