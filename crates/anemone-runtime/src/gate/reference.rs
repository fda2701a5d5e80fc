//! The reference's side of gate runs: its logits and residual stream along each prompt's path,
//! computed by the first gate run that needs them and reused by the next ones on the same
//! prompts (`gate --compare` and `doctor` gate one bundle on two engines against one reference
//! run: the same figures for half the reference's work).

use anemone_models::reference::{ForwardError, ReferenceModel};

use super::ResolvedPrompt;

/// What the reference gave at one step of a prompt.
pub(crate) struct ReferenceStep {
    /// `[vocab]`: the logits after the last id fed.
    pub logits: Vec<f32>,
    /// Per depth (0 = the embeddings), `[ids fed, hidden]` row-major.
    pub hidden_states: Vec<Vec<f32>>,
}

/// One prompt's steps, with what determined them (the reference's path depends only on the
/// prompt and its forced ids).
struct ReferencePrompt {
    ids: Vec<u32>,
    force_ids: Option<Vec<u32>>,
    steps: Vec<ReferenceStep>,
}

/// The fp32 reference of a gate, with the steps it already ran (see the module docs).
pub struct GateReference<'r> {
    model: &'r mut ReferenceModel,
    prompts: Vec<Option<ReferencePrompt>>,
    forwards: usize,
}

impl<'r> GateReference<'r> {
    pub fn new(model: &'r mut ReferenceModel) -> Self {
        GateReference {
            model,
            prompts: Vec::new(),
            forwards: 0,
        }
    }

    pub fn model(&self) -> &ReferenceModel {
        self.model
    }

    /// Reference forward passes run so far (one per prompt step not already known).
    pub fn forwards(&self) -> usize {
        self.forwards
    }

    /// Makes sure `steps` steps of prompt `index` are known, running the reference from empty
    /// states when they are not: the ids fed at each step come from `next` (given the step and
    /// the logits after it; `None` ends the prompt).
    pub(crate) fn ensure(
        &mut self,
        index: usize,
        prompt: &ResolvedPrompt,
        steps: usize,
        next: impl Fn(usize, &[f32]) -> Option<u32>,
    ) -> Result<(), ForwardError> {
        if self.prompts.len() <= index {
            self.prompts.resize_with(index + 1, || None);
        }
        let known = self.prompts[index].as_ref().is_some_and(|p| {
            p.ids == prompt.ids && p.force_ids == prompt.force_ids && p.steps.len() >= steps
        });
        if known {
            return Ok(());
        }
        self.model.reset();
        let mut computed = Vec::with_capacity(steps);
        let mut feed = prompt.ids.clone();
        let vocab = self.model.config().vocab_size;
        for step in 0..steps {
            let r = self.model.forward_traced(&feed)?;
            self.forwards += 1;
            let n = feed.len();
            let logits = r.logits[(n - 1) * vocab..n * vocab].to_vec();
            let fed = (step + 1 < steps).then(|| next(step, &logits)).flatten();
            computed.push(ReferenceStep {
                logits,
                hidden_states: r.hidden_states,
            });
            match fed {
                Some(id) => feed = vec![id],
                None => break,
            }
        }
        self.prompts[index] = Some(ReferencePrompt {
            ids: prompt.ids.clone(),
            force_ids: prompt.force_ids.clone(),
            steps: computed,
        });
        Ok(())
    }

    /// Step `step` of prompt `index` (after [`GateReference::ensure`]).
    pub(crate) fn step(&self, index: usize, step: usize) -> Option<&ReferenceStep> {
        self.prompts.get(index)?.as_ref()?.steps.get(step)
    }
}
