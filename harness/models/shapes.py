"""The published architectures of the registered real checkpoints, as plain dicts, with where each was read.

`SHAPES[name]` holds, for one registered model:
- `config`: the checkpoint's config.json values that fix tensor shapes and code paths (the transformers config
  class fills the rest with its defaults, which only touch training: dropout, init range, ...);
- `processor`: the preprocessor_config.json / processor_config.json values that decide how many placeholder
  tokens an image or a clip becomes (patch and merge sizes, pixel bounds, anyres pinpoints, Whisper settings);
- `tokens`: the checkpoint's special token ids (kept, so a random-weight model sees the real ids);
- `published_params`: the parameter count published for the checkpoint, rounded as published, with its source;
- `sources`: per dict above, the hub file the values come from and the public copy they were read from.

Values were read from public copies of the hub files (the hub itself is not reachable here); each family was then
cross-checked by building the model on the meta device and comparing its parameter count with the published one
(tests/harness/test_shapes.py). harness/models/synthetic.py builds the transformers configs, processors and
seeded random-weight models from these dicts.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------- shared pieces
# CLIP ViT-L/14 at 336 px (openai/clip-vit-large-patch14-336), the vision tower of every LLaVA-v1.6 7B checkpoint:
# the llava-hf config.json vision_config; the same values are LlavaNextConfig's default vision config, which
# transformers' conversion script (src/transformers/models/llava_next/convert_llava_next_weights_to_hf.py) used.
CLIP_L336 = {
    "model_type": "clip_vision_model",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "image_size": 336,
    "patch_size": 14,
    "projection_dim": 768,
    "hidden_act": "quick_gelu",
    "vocab_size": 32000,
}
# llava-hf preprocessor_config.json (LlavaNextImageProcessor of CLIP-336) and processor_config.json.
LLAVA_PROCESSOR = {
    "image": {
        "size": {"shortest_edge": 336},
        "crop_size": {"height": 336, "width": 336},
        "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_pad": True,
        "resample": 3,
    },
    "processor": {"patch_size": 14, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1},
}
LLAVA_TOP = {
    "image_grid_pinpoints": LLAVA_PROCESSOR["image"]["image_grid_pinpoints"],
    "vision_feature_select_strategy": "default",
    "vision_feature_layer": -2,
    "projector_hidden_act": "gelu",
    "image_token_index": 32000,
    "use_image_newline_parameter": True,
    "tie_word_embeddings": False,
}
LLAVA_TOKENS = {
    "bos": ("<s>", 1),
    "eos": ("</s>", 2),
    "unk": ("<unk>", 0),
    "image": ("<image>", 32000),
    "pad": ("<pad>", 32001),
}
LLAVA_SOURCES = {
    "config": "config.json of the hub repo; values read from public copies of that file and of the original "
    "liuhaotian/llava-v1.6-* config.json (GitHub code search), and from transformers' "
    "convert_llava_next_weights_to_hf.py (text config of the base LLM, vocabulary padded to 32064 after "
    "adding <image>=32000 and <pad>=32001, CLIP-336 vision tower, pinpoints of the CLIP-336 processor)",
    "processor": "preprocessor_config.json and processor_config.json of the hub repo (patch_size 14, 'default' "
    "feature strategy, one additional CLS token), read from public copies in GitHub code",
}

# Qwen3-VL vision towers share everything but width, depth and deepstack taps (hub config.json vision_config).
QWEN3_VL_VISION = {
    "hidden_act": "gelu_pytorch_tanh",
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 2304,
    "num_heads": 16,
}
# Qwen/Qwen3-VL-*-Instruct preprocessor_config.json: pixel bounds as size {shortest_edge, longest_edge} (pixels).
QWEN3_VL_PROCESSOR = {
    "image": {
        "patch_size": 16,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "min_pixels": 65536,
        "max_pixels": 16777216,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
}
QWEN_TOKENS = {
    "endoftext": ("<|endoftext|>", 151643),
    "im_start": ("<|im_start|>", 151644),
    "im_end": ("<|im_end|>", 151645),
    "vision_start": ("<|vision_start|>", 151652),
    "vision_end": ("<|vision_end|>", 151653),
    "image": ("<|image_pad|>", 151655),
    "video": ("<|video_pad|>", 151656),
}
QWEN3_VL_IDS = {
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": False,
}
MROPE_TEXT = {"rope_theta": 5000000, "rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True}
QWEN3_VL_SOURCES = {
    "config": "config.json of the hub repo, read from public copies in GitHub code (full dumps of the 4B file; the "
    "8B text and vision values in model-reading notes and test fixtures that spell out the released shape)",
    "processor": "preprocessor_config.json of the hub repo (size.shortest_edge 65536, size.longest_edge 16777216, "
    "patch 16, merge 2), read from public copies in GitHub code",
}

# ----------------------------------------------------------------------------- the models
SHAPES: dict[str, dict] = {
    "llava-v1.6-7b": {
        "hub_id": "llava-hf/llava-v1.6-vicuna-7b-hf",
        "config": {
            **LLAVA_TOP,
            # lmsys/vicuna-7b-v1.5 (Llama-2-7B shape), vocabulary padded to 32064.
            "text_config": {
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 11008,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 32,
                "vocab_size": 32064,
                "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0,
                "tie_word_embeddings": False,
                "pad_token_id": 32001,
            },
            "vision_config": CLIP_L336,
        },
        "processor": LLAVA_PROCESSOR,
        "tokens": LLAVA_TOKENS,
        "published_params": (7.06e9, "the hub page's safetensors size of llava-hf/llava-v1.6-vicuna-7b-hf: 7.06B"),
        "sources": LLAVA_SOURCES,
    },
    "llava-v1.6-mistral-7b": {
        "hub_id": "llava-hf/llava-v1.6-mistral-7b-hf",
        "config": {
            **LLAVA_TOP,
            # mistralai/Mistral-7B-Instruct-v0.2: GQA 32/8, rope_theta 1e6, no sliding window; vocabulary 32064.
            "text_config": {
                "model_type": "mistral",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 32064,
                "max_position_embeddings": 32768,
                "rms_norm_eps": 1e-5,
                "rope_theta": 1000000.0,
                "sliding_window": None,
                "tie_word_embeddings": False,
                "pad_token_id": 32001,
            },
            "vision_config": CLIP_L336,
        },
        "processor": LLAVA_PROCESSOR,
        "tokens": LLAVA_TOKENS,
        "published_params": (7.57e9, "the hub page's safetensors size of llava-hf/llava-v1.6-mistral-7b-hf: 7.57B"),
        "sources": LLAVA_SOURCES,
    },
    "qwen3-vl-4b": {
        "hub_id": "Qwen/Qwen3-VL-4B-Instruct",
        "config": {
            **QWEN3_VL_IDS,
            "tie_word_embeddings": True,
            "text_config": {
                "hidden_size": 2560,
                "intermediate_size": 9728,
                "num_hidden_layers": 36,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "vocab_size": 151936,
                "max_position_embeddings": 262144,
                "rms_norm_eps": 1e-6,
                "rope_parameters": MROPE_TEXT,
                "tie_word_embeddings": True,
                "bos_token_id": 151643,
                "eos_token_id": 151645,
            },
            "vision_config": {
                **QWEN3_VL_VISION,
                "depth": 24,
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "out_hidden_size": 2560,
                "deepstack_visual_indexes": [5, 11, 17],
            },
        },
        "processor": QWEN3_VL_PROCESSOR,
        "tokens": QWEN_TOKENS,
        "published_params": (4.44e9, "the hub page's safetensors size of Qwen/Qwen3-VL-4B-Instruct: 4.44B"),
        "sources": QWEN3_VL_SOURCES,
    },
    "qwen3-vl-8b": {
        "hub_id": "Qwen/Qwen3-VL-8B-Instruct",
        "config": {
            **QWEN3_VL_IDS,
            "text_config": {
                "hidden_size": 4096,
                "intermediate_size": 12288,
                "num_hidden_layers": 36,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "vocab_size": 151936,
                "max_position_embeddings": 262144,
                "rms_norm_eps": 1e-6,
                "rope_parameters": MROPE_TEXT,
                "tie_word_embeddings": False,
                "bos_token_id": 151643,
                "eos_token_id": 151645,
            },
            "vision_config": {
                **QWEN3_VL_VISION,
                "depth": 27,
                "hidden_size": 1152,
                "intermediate_size": 4304,
                "out_hidden_size": 4096,
                "deepstack_visual_indexes": [8, 16, 24],
            },
        },
        "processor": QWEN3_VL_PROCESSOR,
        "tokens": QWEN_TOKENS,
        "published_params": (8.77e9, "the hub page's safetensors size of Qwen/Qwen3-VL-8B-Instruct: 8.77B"),
        "sources": QWEN3_VL_SOURCES,
    },
    "qwen3-omni-30b-a3b": {
        "hub_id": "Qwen/Qwen3-Omni-30B-A3B-Instruct",
        # The thinker only (enable_audio_output False): the harness generates text with it; talker and code2wav
        # are never built.
        "config": {
            "enable_audio_output": False,
            "thinker_config": {
                "audio_token_id": 151675,
                "image_token_id": 151655,
                "video_token_id": 151656,
                "audio_start_token_id": 151669,
                "audio_end_token_id": 151670,
                "vision_start_token_id": 151652,
                "vision_end_token_id": 151653,
                "user_token_id": 872,
                "position_id_per_seconds": 13,
                "seconds_per_chunk": 2,
                "tie_word_embeddings": False,
                "text_config": {
                    "hidden_size": 2048,
                    "intermediate_size": 768,
                    "moe_intermediate_size": 768,
                    "num_hidden_layers": 48,
                    "num_attention_heads": 32,
                    "num_key_value_heads": 4,
                    "head_dim": 128,
                    "num_experts": 128,
                    "num_experts_per_tok": 8,
                    "decoder_sparse_step": 1,
                    "mlp_only_layers": [],
                    "norm_topk_prob": True,
                    "vocab_size": 152064,
                    "max_position_embeddings": 65536,
                    "rms_norm_eps": 1e-6,
                    "rope_parameters": {
                        "rope_theta": 1000000,
                        "rope_type": "default",
                        "mrope_section": [24, 20, 20],
                        "mrope_interleaved": True,
                        "interleaved": True,
                    },
                    "tie_word_embeddings": False,
                },
                "audio_config": {
                    "d_model": 1280,
                    "encoder_layers": 32,
                    "encoder_attention_heads": 20,
                    "encoder_ffn_dim": 5120,
                    "num_mel_bins": 128,
                    "output_dim": 2048,
                    "max_source_positions": 1500,
                    "n_window": 50,
                    "n_window_infer": 800,
                    "conv_chunksize": 500,
                    "downsample_hidden_size": 480,
                    "activation_function": "gelu",
                },
                "vision_config": {
                    **QWEN3_VL_VISION,
                    "depth": 27,
                    "hidden_size": 1152,
                    "intermediate_size": 4304,
                    "out_hidden_size": 2048,
                    "deepstack_visual_indexes": [8, 16, 24],
                },
            },
        },
        # preprocessor_config.json: Qwen2VLImageProcessor (min_pixels 3136, max_pixels 12845056, patch 16, merge 2)
        # and WhisperFeatureExtractor (128 mel bins, 16 kHz, 25 ms / 10 ms frames, 300 s chunk = 4,800,000 samples).
        "processor": {
            "image": {
                "patch_size": 16,
                "merge_size": 2,
                "temporal_patch_size": 2,
                "min_pixels": 3136,
                "max_pixels": 12845056,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
            },
            "audio": {
                "feature_size": 128,
                "sampling_rate": 16000,
                "hop_length": 160,
                "n_fft": 400,
                "chunk_length": 300,
                "n_samples": 4800000,
                "nb_max_frames": 30000,
                "padding_side": "right",
                "padding_value": 0.0,
                "return_attention_mask": True,
                "dither": 0.0,
            },
        },
        "tokens": {
            **QWEN_TOKENS,
            "audio": ("<|audio_pad|>", 151675),
            "audio_start": ("<|audio_start|>", 151669),
            "audio_end": ("<|audio_end|>", 151670),
        },
        # The hub page's 35.3B counts talker and code2wav too; the thinker's text backbone has the shape of
        # Qwen3-30B-A3B (48 layers, 32/4 heads, 128 experts, 8 active), whose model card gives 29.9B non-embedding.
        "published_params": (
            29.9e9,
            "non-embedding parameters of the thinker's text backbone: the Qwen3-30B-A3B "
            "model card's 'Number of Parameters (Non-Embedding): 29.9B' (same text shape)",
        ),
        "sources": {
            "config": "config.json of the hub repo (thinker_config), read from a public GitHub model report that "
            "prints the config transformers 5.7 loaded from Qwen3-Omni-30B-A3B-Instruct, "
            "with its module tree; "
            "the text backbone cross-checked with keras-team/keras-hub "
            "keras_hub/src/models/qwen3_omni/qwen3_omni_presets.py (48 layers, 32 query / 4 KV heads, "
            "128 experts, 8 active) and tzhouam/vllm-omni benchmarks/qwen3-omni/transformers/"
            "model_structure_output/qwen3_omni_architecture.md (hidden 2048, vocabulary 152064)",
            "processor": "preprocessor_config.json of the hub repo (Qwen3-Omni-30B-A3B-Instruct/-Thinking/"
            "-Captioner share it), read from public copies in GitHub code; the audio token count is "
            "the processor's _get_feat_extract_output_lengths (13 tokens per 100 mel frames = 1 s)",
        },
    },
    "qwen3-8b": {
        "hub_id": "Qwen/Qwen3-8B",
        "config": {
            "model_type": "qwen3",
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
        },
        "processor": {},
        "tokens": {k: QWEN_TOKENS[k] for k in ("endoftext", "im_start", "im_end")},
        "published_params": (
            8.2e9,
            "the Qwen/Qwen3-8B model card: 'Number of Parameters: 8.2B' (Non-Embedding: 6.95B)",
        ),
        "sources": {
            "config": "config.json of the hub repo, read from public copies in GitHub code; checked "
            "against the model card's 8.2B total and 6.95B non-embedding"
        },
    },
    "llama-3.1-8b": {
        "hub_id": "meta-llama/Llama-3.1-8B-Instruct",
        "config": {
            "model_type": "llama",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "tie_word_embeddings": False,
            "bos_token_id": 128000,
            "eos_token_id": [128001, 128008, 128009],
        },
        "processor": {},
        "tokens": {
            "bos": ("<|begin_of_text|>", 128000),
            "end_of_text": ("<|end_of_text|>", 128001),
            "start_header": ("<|start_header_id|>", 128006),
            "end_header": ("<|end_header_id|>", 128007),
            "eot": ("<|eot_id|>", 128009),
        },
        "published_params": (8.03e9, "the hub page's safetensors size of meta-llama/Llama-3.1-8B-Instruct: 8.03B"),
        "sources": {
            "config": "config.json of the hub repo (llama3 rope scaling), read from public copies in GitHub code"
        },
    },
}


def shape(name: str) -> dict:
    """SHAPES[name], or a KeyError naming the models that have a shape-real build."""
    if name not in SHAPES:
        raise KeyError(
            f"no shape-real architecture recorded for {name!r}; models with one: {', '.join(sorted(SHAPES))}"
        )
    return SHAPES[name]
