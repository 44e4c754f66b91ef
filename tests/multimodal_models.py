"""Tiny random multimodal models, built locally (no hub) with their processors, for the exactness oracles: each
a transformers model of the family with a small tower and the demo tokenizer's vocabulary plus its media tokens,
so the text model is one the native decoder stack serves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from architectures import TINY_SIZES

# the text families' tiny sizes (architectures.py), with room for a split image's tokens
TEXT = {**TINY_SIZES, "max_position_embeddings": 1024, "tie_word_embeddings": False}


def chat_template(image: str = "<image>", video: str = "<video>", audio: str = "<|AUDIO|>") -> str:
    """Role-prefixed turns; each media part is the family's placeholder text, text parts as they are."""
    return (
        "{% for m in messages %}{{ m['role'].upper() }}: "
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
        f"{{% if p['type'] == 'image' %}}{image}{{% elif p['type'] == 'video' %}}{video}"
        f"{{% elif p['type'] == 'audio' %}}{audio}{{% else %}}{{{{ p['text'] }}}}"
        "{% endif %}{% endfor %}{% endif %}\n{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    )


CHAT_TEMPLATE = chat_template()
FAMILIES = ("llava", "llava_siglip", "idefics3", "qwen2_audio", "qwen2_vl", "qwen2_5_vl")
# the text an image part is in each family's prompt, as TensorRT-LLM's clients write it into text_input
IMAGE_PLACEHOLDERS = {
    "llava": "<image>",
    "llava_siglip": "<image>",
    "idefics3": "<image>",
    "qwen2_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
}
IMAGE_FAMILIES = tuple(IMAGE_PLACEHOLDERS)


def build_multimodal(family: str, tokenizer_dir: Path, out_dir: Path) -> Path:
    """Writes a tiny random `family` model with its processor into out_dir/family (once)."""
    target = out_dir / family
    if (target / "config.json").exists():
        return target
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    build = {
        "llava": _llava,
        "llava_siglip": lambda transformers, tokenizer: _llava(transformers, tokenizer, "siglip"),
        "idefics3": _idefics3,
        "qwen2_audio": _qwen2_audio,
        "qwen2_vl": _qwen2_vl,
        "qwen2_5_vl": _qwen2_5_vl,
    }[family]
    model, processor = build(transformers, tokenizer)
    partial = out_dir / f"{family}.partial"
    model.eval().save_pretrained(partial)
    if isinstance(processor, tuple):  # parts saved one by one: transformers' processor would need torchvision
        for part in processor[:-1]:
            part.save_pretrained(partial)
        (partial / "chat_template.jinja").write_text(processor[-1])
    else:
        processor.save_pretrained(partial)
    partial.replace(target)
    return target


def _text_config(transformers, tokenizer, kind: str = "LlamaConfig"):
    return getattr(transformers, kind)(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TEXT,
    )


def _llava(transformers, tokenizer, tower: str = "clip"):
    """LLaVA 1.5: a CLIP tower (its second-to-last layer, the class token dropped), an MLP projector, Llama; or a
    SigLIP tower, which has no class token, so every patch's features of its last layer are kept (strategy "full")."""
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32)
    if tower == "clip":
        vision = transformers.CLIPVisionConfig(**sizes, patch_size=8)
        images = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        layer, strategy, class_tokens = -2, "default", 1
    else:
        vision = transformers.SiglipVisionConfig(**sizes, patch_size=8)
        images = SiglipImageProcessorPil(size={"height": 32, "width": 32})
        layer, strategy, class_tokens = -1, "full", 0
    config = transformers.LlavaConfig(
        text_config=_text_config(transformers, tokenizer),
        vision_config=vision,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_layer=layer,
        vision_feature_select_strategy=strategy,
    )
    processor = transformers.LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy=strategy,
        num_additional_image_tokens=class_tokens,
        chat_template=CHAT_TEMPLATE,
    )
    return transformers.LlavaForConditionalGeneration(config), processor


def _idefics3(transformers, tokenizer):
    """Idefics3 (SmolVLM's architecture): a SigLIP-style tower on each crop of a split image, pixel shuffle, Llama."""
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokens = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
    tokens += [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    vision = transformers.Idefics3VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
    )
    config = transformers.Idefics3Config(
        text_config=_text_config(transformers, tokenizer),
        vision_config=vision,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=2,
    )
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": 64}, max_image_size={"longest_edge": 32}, do_image_splitting=True
    )
    processor = transformers.Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=4, chat_template=CHAT_TEMPLATE
    )
    return transformers.Idefics3ForConditionalGeneration(config), processor


def _qwen2_audio(transformers, tokenizer):
    """Qwen2-Audio: a Whisper-style encoder on 128 log-mel bins, pooled, a linear projector, Qwen2."""
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]})
    audio = transformers.Qwen2AudioEncoderConfig(
        d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, num_mel_bins=128
    )
    config = transformers.Qwen2AudioConfig(
        audio_config=audio,
        text_config=_text_config(transformers, tokenizer, "Qwen2Config"),
        audio_token_index=tokenizer.convert_tokens_to_ids("<|AUDIO|>"),
    )
    features = transformers.WhisperFeatureExtractor(feature_size=128)
    processor = transformers.Qwen2AudioProcessor(
        feature_extractor=features, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE, audio_token="<|AUDIO|>"
    )
    return transformers.Qwen2AudioForConditionalGeneration(config), processor


def _qwen2_5_vl(transformers, tokenizer):
    """Qwen2.5-VL: Qwen2-VL's layout with a windowed-attention ViT (one block of full attention) and SwiGLU."""
    vision = dict(
        depth=2,
        hidden_size=32,
        out_hidden_size=64,
        intermediate_size=64,
        num_heads=4,
        patch_size=8,
        spatial_merge_size=2,
        window_size=32,
        fullatt_block_indexes=[1],
    )
    return _qwen2_vl(transformers, tokenizer, "Qwen2_5_VL", vision)


def _qwen2_vl(transformers, tokenizer, kind: str = "Qwen2VL", vision: dict | None = None):
    """Qwen2-VL: a ViT on dynamic-resolution patches (two frames a temporal patch), 2x2 patches merged, Qwen2 with
    M-RoPE (temporal, height and width positions for the media tokens)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokens = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    text = _text_config(transformers, tokenizer, "Qwen2Config").to_dict()
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    vision = vision or dict(
        depth=2, embed_dim=32, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=8, spatial_merge_size=2
    )
    config = getattr(transformers, f"{kind}Config")(
        text_config={k: v for k, v in text.items() if k not in ("architectures", "model_type")},
        vision_config=vision,
        image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
    )
    images = Qwen2VLImageProcessorPil(min_pixels=32 * 32, max_pixels=64 * 64, patch_size=8, merge_size=2)
    template = chat_template(
        "<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|><|video_pad|><|vision_end|>"
    )
    model = getattr(transformers, f"{kind}ForConditionalGeneration")(config)
    return model, (images, tokenizer, template)


def wav(seed: int, seconds: float = 1.0, rate: int = 16_000) -> bytes:
    """A random 16-bit mono WAV clip."""
    import io
    import wave

    import numpy as np

    samples = (np.random.RandomState(seed).uniform(-0.5, 0.5, int(seconds * rate)) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(rate)
        clip.writeframes(samples.tobytes())
    return out.getvalue()


def wav_samples(data: bytes):
    """A 16-bit WAV's samples as float32 in [-1, 1): what any decoder gives for them."""
    import io
    import wave

    import numpy as np

    with wave.open(io.BytesIO(data)) as clip:
        return np.frombuffer(clip.readframes(clip.getnframes()), dtype="<i2").astype(np.float32) / 32768


def transparent_png(seed: int, mode: str, size: tuple[int, int] = (40, 70)) -> bytes:
    """A random picture with transparency as PNG bytes: `mode` RGBA or LA (an alpha band, half its pixels wholly
    transparent), or P (a palette with a transparent index). Under the transparent pixels lies a saturated colour,
    which a plain convert("RGB") keeps and a white background hides."""
    import io

    import numpy as np
    from PIL import Image

    random = np.random.RandomState(seed)
    colour = random.randint(0, 255, (*size, 3), dtype=np.uint8)
    alpha = random.choice(np.array([0, 0, 90, 255], dtype=np.uint8), size)
    colour[alpha == 0] = (255, 0, 255)
    out = io.BytesIO()
    if mode == "P":
        picture = Image.fromarray(colour).quantize(colors=16, dither=Image.Dither.NONE)
        palette = np.asarray(picture)
        picture.info["transparency"] = int(palette[alpha == 0][0])
        picture.save(out, "PNG", transparency=picture.info["transparency"])
    else:
        bands = np.dstack([colour if mode == "RGBA" else colour[..., :1], alpha])
        Image.fromarray(bands, mode).save(out, "PNG")
    return out.getvalue()


def png(seed: int, size: tuple[int, int] = (40, 70)) -> bytes:
    """A random RGB picture as PNG bytes."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.RandomState(seed).randint(0, 255, (*size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


@dataclass(frozen=True)
class Video:
    data: bytes  # an encoded video file


def mp4(seed: int, frames: int = 6, size: int = 48) -> bytes:
    """A short random MPEG-4 video."""
    import io

    import av
    import numpy as np

    out = io.BytesIO()
    noise = np.random.RandomState(seed)
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = size, size, "yuv420p"
        for _ in range(frames):
            picture = noise.randint(0, 255, (size, size, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


class Reference:
    """transformers' generate() on a multimodal model given the same pictures: the oracle."""

    def __init__(self, model_dir: Path) -> None:
        import transformers

        from tritonllm.multimodal.prompt_builder import load_processor

        audio = "qwen2_audio" in Path(model_dir).name
        loader = transformers.Qwen2AudioForConditionalGeneration if audio else transformers.AutoModelForImageTextToText
        self.model = loader.from_pretrained(model_dir).eval()
        self.processor = load_processor(model_dir)

    def ids(self, parts: list, max_new_tokens: int) -> list[int]:
        """`parts`: the user turn's content in order, each a str (text), bytes (an encoded picture, or a WAV clip
        for an audio model) or a Video (its frames decoded as the server decodes them)."""
        import io

        from PIL import Image

        from tritonllm.media import decode
        from tritonllm.multimodal.prompt_builder import VIDEO_FRAMES

        audio = hasattr(self.processor, "feature_extractor")

        def kind(part) -> dict:
            if isinstance(part, str):
                return {"type": "text", "text": part}
            return {"type": "video" if isinstance(part, Video) else "audio" if audio else "image"}

        prompt = self.processor.apply_chat_template(
            [{"role": "user", "content": [kind(p) for p in parts]}], add_generation_prompt=True
        )
        arguments: dict = {}
        pictures = [p for p in parts if isinstance(p, bytes)]
        videos = [decode.video(p.data, "video", VIDEO_FRAMES) for p in parts if isinstance(p, Video)]
        if audio:
            arguments = {"audio": [wav_samples(p) for p in pictures], "sampling_rate": 16_000}
        elif pictures:
            # as the file decodes: the processor makes it RGB its own way (convert_to_rgb lays transparency over white)
            arguments["images"] = [Image.open(io.BytesIO(p)) for p in pictures]
        if videos:
            arguments["videos"] = videos
        inputs = self.processor(text=[prompt], return_tensors="pt", **arguments)
        out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        return out[0, inputs["input_ids"].shape[1] :].tolist()

    def raw_ids(self, prompt: str, pictures: list[bytes], max_new_tokens: int) -> list[int]:
        """A prompt as written, its image placeholders in it (TensorRT-LLM's clients' way), and its pictures."""
        import io

        from PIL import Image

        images = [Image.open(io.BytesIO(p)) for p in pictures]
        inputs = self.processor(text=[prompt], images=images, return_tensors="pt")
        out = self.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        return out[0, inputs["input_ids"].shape[1] :].tolist()

    def text(self, parts: list, max_new_tokens: int) -> str:
        return self.processor.tokenizer.decode(self.ids(parts, max_new_tokens), skip_special_tokens=True)
