//! Which encoder workers take which of a request's items (one group per pool, so items
//! may share batches), and, jointly with routing, whether to encode them at all.

use std::time::Duration;

use switchyard_core::WorkerId;
use switchyard_core::protocol::Prompt;
use switchyard_router::routing::encoders::{MediaWork, job_estimate_ms};
use switchyard_runtime::WorkerInstance;

use super::{Encoded, Frontend};
use crate::media::MediaItem;
use crate::openai::ApiError;

/// Items that go to the same encoder workers (the best first), and how long they are
/// estimated to take.
pub(super) struct Group {
    pub(super) takers: Vec<WorkerInstance>,
    pub(super) members: Vec<MediaItem>,
    pub(super) estimate_ms: f64,
}

/// What encoding a request's media takes.
pub(super) enum Plan {
    /// Nothing: no items, or no encoder worker takes them.
    Nothing,
    /// Nothing: the worker predicted to answer soonest holds the media's KV.
    Held(WorkerId),
    Encode(Vec<Group>),
}

impl Frontend {
    /// Encodes the request's media on encoder workers and returns once it is done (with the
    /// hashes of the items encoded); at once when there are no items or no encoder workers
    /// (media then costs no encoding time).
    /// Items go to the workers that take their modality, all the items one set of workers
    /// takes to one of them (so they may share batches); items no encoder worker takes are
    /// not encoded. A 503 when no encoder worker takes a group.
    pub async fn encode_media(
        &self,
        items: &[MediaItem],
        prompt: &Prompt,
    ) -> Result<Encoded, ApiError> {
        match self.plan_encoding(items, prompt) {
            Plan::Nothing => Ok(Encoded::default()),
            Plan::Held(worker) => Ok(Encoded {
                holder: Some(worker),
                ..Encoded::default()
            }),
            Plan::Encode(groups) => self.run_plan(&groups).await,
        }
    }

    /// Groups the items by the encoder workers that take them and, jointly with routing,
    /// decides whether to encode them at all.
    pub(super) fn plan_encoding(&self, items: &[MediaItem], prompt: &Prompt) -> Plan {
        if items.is_empty() {
            return Plan::Nothing;
        }
        let groups = self.groups_for(items);
        if groups.is_empty() {
            return Plan::Nothing;
        }
        if !self.config.multimodal.joint_routing {
            return Plan::Encode(groups);
        }
        // The soonest the media could reach a worker: per group, the first encoder's queue
        // and the group's batches; the last group to finish, and the embeddings' transfer.
        let ready_ms = groups
            .iter()
            .map(|g| self.media.outstanding_ms(g.takers[0].worker_id) + g.estimate_ms)
            .fold(0f64, f64::max);
        let media_tokens: u64 = items.iter().map(|i| u64::from(i.tokens)).sum();
        let encode = Duration::from_secs_f64(ready_ms / 1e3)
            + self.media.encoder_cost().transfer_time(media_tokens);
        match self.routing.sooner_holder(prompt, encode) {
            Some(holder) => {
                self.metrics.count_media_encode("skipped");
                Plan::Held(holder)
            }
            None => Plan::Encode(groups),
        }
    }

    /// The items grouped by the encoder workers that take them (the best first), with
    /// their estimated time; none without encoder workers.
    pub(super) fn groups_for(&self, items: &[MediaItem]) -> Vec<Group> {
        let encoders = self.routing.encoders();
        if encoders.is_empty() {
            return Vec::new();
        }
        let cost = self.media.encoder_cost();
        group_by_takers(items, &encoders)
            .into_iter()
            .map(|(mut takers, members)| {
                self.media.order_encoders(&mut takers);
                let estimate_ms = job_estimate_ms(
                    &cost,
                    members.iter().map(|i| MediaWork {
                        owner: 0,
                        modality: i.modality,
                        tokens: i.tokens,
                    }),
                );
                Group {
                    takers,
                    members: members.into_iter().cloned().collect(),
                    estimate_ms,
                }
            })
            .collect()
    }
}

/// A request's items grouped by the encoder workers that take their modality; items no
/// encoder worker takes are left out.
fn group_by_takers<'a>(
    items: &'a [MediaItem],
    encoders: &[WorkerInstance],
) -> Vec<(Vec<WorkerInstance>, Vec<&'a MediaItem>)> {
    let mut groups: Vec<(Vec<WorkerInstance>, Vec<&MediaItem>)> = Vec::new();
    for item in items {
        let takers: Vec<WorkerInstance> = encoders
            .iter()
            .filter(|e| e.modalities.contains(item.modality))
            .cloned()
            .collect();
        if takers.is_empty() {
            continue;
        }
        match groups.iter_mut().find(|(t, _)| same_workers(t, &takers)) {
            Some((_, members)) => members.push(item),
            None => groups.push((takers, vec![item])),
        }
    }
    groups
}

/// Whether two lists name the same workers (in any order).
fn same_workers(a: &[WorkerInstance], b: &[WorkerInstance]) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|x| b.iter().any(|y| y.worker_id == x.worker_id))
}

#[cfg(test)]
mod tests {
    use switchyard_core::{Modalities, Modality, WorkerId, WorkerRole};

    use super::*;

    fn encoder(id: u64, modalities: &[Modality]) -> WorkerInstance {
        WorkerInstance {
            role: WorkerRole::Encoder,
            modalities: Modalities::from(modalities.to_vec()),
            ..WorkerInstance::new(WorkerId(id), "m")
        }
    }

    fn item(modality: Modality, hash: u64) -> MediaItem {
        MediaItem {
            modality,
            tokens: 10,
            hash,
            input: None,
        }
    }

    fn ids(workers: &[WorkerInstance]) -> Vec<u64> {
        let mut ids: Vec<u64> = workers.iter().map(|w| w.worker_id.0).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn items_go_to_the_encoders_of_their_modality_and_share_one_when_the_pool_is_the_same() {
        use Modality::*;
        let fleet = [
            encoder(1, &[]),
            encoder(2, &[Audio]),
            encoder(3, &[Image, Video]),
        ];
        let items = [
            item(Image, 1),
            item(Audio, 2),
            item(Video, 3),
            item(Image, 4),
        ];
        let groups = group_by_takers(&items, &fleet);
        let shape: Vec<(Vec<u64>, Vec<u64>)> = groups
            .iter()
            .map(|(t, m)| (ids(t), m.iter().map(|i| i.hash).collect()))
            .collect();
        // Images and video: worker 1 (everything) and 3; audio: 1 and 2.
        assert_eq!(
            shape,
            vec![(vec![1, 3], vec![1, 3, 4]), (vec![1, 2], vec![2])]
        );
        // No encoder takes images: they are not encoded; audio still is.
        let audio_only = [encoder(2, &[Audio])];
        let groups = group_by_takers(&items, &audio_only);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].1.len(), 1);
        assert_eq!(groups[0].1[0].modality, Audio);
    }
}
