"""Images and audio through the official `openai` Python SDK: each request priced as OpenAI bills it, from the
built-in table's own prices (crates/core/prices/builtin.json): DALL-E per image by size and quality, gpt-image by
its image tokens, text to speech per character, transcription per second or by its audio tokens. The mock answers
as OpenAI does (see crates/testkit: gpt-image's usage is the prompt's words + 1 in and 4,160 tokens an image out;
a transcription lasts a second per 16,000 bytes of its file)."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from conftest import request_id

TABLE = json.loads((Path(__file__).resolve().parents[2] / "crates/core/prices/builtin.json").read_text())["models"]
MILLION = Decimal(1_000_000)


def price(model: str, component: str) -> Decimal:
    return Decimal(TABLE[model][component])


def usd(amount: Decimal) -> str:
    """Dollars as receipts print them: rounded once to the nano-dollar, at least two decimals, no trailing zeros."""
    text = format(amount.quantize(Decimal("0.000000001"), rounding=ROUND_HALF_UP), "f").rstrip("0")
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction:0<2}"


def test_dall_e_is_billed_per_image_by_size_and_quality(tenant, openai_client, ledger):
    client = openai_client(tenant.secret)
    raw = client.images.with_raw_response.generate(model="dall-e-3", prompt="a lighthouse at dawn",
                                                   size="1024x1792", quality="hd", n=1)
    image = raw.parse()
    assert len(image.data) == 1 and image.data[0].url, image
    rid = request_id(raw.headers)
    receipt = ledger.settle_tenant(tenant, [rid])[rid]
    assert (receipt["endpoint"], receipt["model"], receipt["images"]) == ("/v1/images/generations", "dall-e-3", 1)
    assert receipt["cost_usd"] == usd(price("dall-e-3#hd-1024x1792", "per_image_usd")) == "0.12", receipt


def test_gpt_image_is_billed_by_its_image_tokens(tenant, openai_client, ledger):
    client = openai_client(tenant.secret)
    raw = client.images.with_raw_response.generate(model="gpt-image-1", prompt="a red fox in snow")
    image = raw.parse()
    assert image.data[0].b64_json and image.usage.output_tokens == 4160, image
    rid = request_id(raw.headers)
    receipt = ledger.settle_tenant(tenant, [rid])[rid]
    # "a red fox in snow": 5 words + 1 text tokens in; 4,160 image tokens out.
    assert (receipt["input_tokens"], receipt["image_output_tokens"]) == (6, 4160), receipt
    expected = (6 * price("gpt-image-1", "input_per_mtok_usd")
                + 4160 * price("gpt-image-1", "image_output_per_mtok_usd")) / MILLION
    assert receipt["cost_usd"] == usd(expected) == "0.16643", receipt


def test_text_to_speech_is_billed_per_character(tenant, openai_client, ledger):
    client = openai_client(tenant.secret)
    text = "Read this aloud. " * 235 + "Done."  # 4,000 characters
    assert len(text) == 4000
    raw = client.audio.speech.with_raw_response.create(model="tts-1", voice="alloy", input=text)
    assert raw.headers["content-type"].startswith("audio/") and len(raw.content) > 0
    rid = request_id(raw.headers)
    receipt = ledger.settle_tenant(tenant, [rid])[rid]
    assert (receipt["endpoint"], receipt["model"], receipt["characters"]) == ("/v1/audio/speech", "tts-1", 4000)
    assert receipt["cost_usd"] == usd(4000 * price("tts-1", "per_million_characters_usd") / MILLION) == "0.06"


def test_whisper_is_billed_per_second_and_gpt_4o_transcribe_by_its_audio_tokens(tenant, openai_client, ledger):
    client = openai_client(tenant.secret)
    audio = bytes(160_000)  # ten seconds at the mock's 16,000 bytes a second
    raw = client.audio.transcriptions.with_raw_response.create(model="whisper-1", file=("speech.mp3", audio))
    assert raw.parse().text
    whisper = request_id(raw.headers)
    raw = client.audio.transcriptions.with_raw_response.create(model="gpt-4o-transcribe",
                                                               file=("speech.mp3", audio))
    transcribed = raw.parse()
    assert transcribed.usage.input_token_details.audio_tokens == 100, transcribed
    tokens = request_id(raw.headers)
    receipts = ledger.settle_tenant(tenant, [whisper, tokens])

    receipt = receipts[whisper]
    assert (receipt["model"], receipt["seconds"]) == ("whisper-1", 10), receipt
    assert receipt["cost_usd"] == usd(10 * price("whisper-1", "per_million_seconds_usd") / MILLION) == "0.001"

    receipt = receipts[tokens]
    assert (receipt["model"], receipt["audio_input_tokens"]) == ("gpt-4o-transcribe", 100), receipt
    text_in = receipt["input_tokens"] - receipt["audio_input_tokens"]
    expected = (100 * price("gpt-4o-transcribe", "audio_input_per_mtok_usd")
                + text_in * price("gpt-4o-transcribe", "input_per_mtok_usd")
                + receipt["output_tokens"] * price("gpt-4o-transcribe", "output_per_mtok_usd")) / MILLION
    assert receipt["output_tokens"] == transcribed.usage.output_tokens
    assert receipt["cost_usd"] == usd(expected), receipt
