"""Transformers entry point of an fsframework export whose kind is not the Llama architecture
(every kind but tfpp; docs/export.md). `fsf export` copies this file into the export directory,
and `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` then builds the model
through fsframework (which must be importable) and loads model.safetensors into it.

The fsframework models take no padding mask and keep no transformers cache: `generate()` runs
the whole sequence at every step (greedy or sampled, one prompt length per batch).
"""

import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from fsframework.export.remote import build_language_model


class FSFrameworkConfig(PretrainedConfig):
    """config.json of the export: `fsframework` holds the model config and the versions."""

    model_type = "fsframework"

    def __init__(self, fsframework=None, **kwargs):
        self.fsframework = fsframework or {}
        kwargs.setdefault("use_cache", False)
        super().__init__(**kwargs)


class FSFrameworkForCausalLM(PreTrainedModel, GenerationMixin):
    """The fsframework language model as `self.model`; its tensors are stored as `model.<name>`."""

    config_class = FSFrameworkConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _tied_weights_keys = ["model.lm_head.weight"]

    def __init__(self, config):
        super().__init__(config)
        self.model = build_language_model(config.fsframework["model"], config.fsframework.get("schema_version"))
        self.post_init()

    def _init_weights(self, module):
        # the weights are read from model.safetensors; fsframework's own init already ran
        pass

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return self.model.lm_head

    def set_output_embeddings(self, value):
        self.model.lm_head = value

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("fsframework models take no padding mask: batch prompts of one length")
        logits = self.model(input_ids)
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs, shifted here
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        # no cache: every step reads the whole sequence so far
        return {"input_ids": input_ids, "attention_mask": attention_mask}
