"""load_rgb and expand_image_paths: every pixel mode to sensible RGB, bad files to one-line errors."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import shared_data
from inceptionlab.data.io.decode import ImageReadError, decode_rgb, load_rgb
from inceptionlab.data.io.image_files import IMAGE_EXTENSIONS, counts_as_image, expand_image_paths
from inceptionlab.errors import UserError

WHITE = (255, 255, 255)
RED = (255, 0, 0)


def pixels(image: Image.Image) -> np.ndarray:
    """H x W x 3 int array, so comparisons don't wrap around at 255."""
    assert image.mode == "RGB"
    return np.asarray(image).astype(int)


def saved(image: Image.Image, path: Path, **params) -> Path:
    image.save(path, **params)
    return path


def opened_mode(path: Path) -> str:
    """The mode PIL decodes the file to, so a test can check it exercises the intended branch."""
    with Image.open(path) as image:
        return image.mode


def expect_read_error(path: Path, *fragments: str) -> ImageReadError:
    with pytest.raises(ImageReadError) as info:
        load_rgb(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message
    return info.value


# ---------------------------------------------------------------------------------------------
# Pixel modes


def test_rgb_jpeg_stays_rgb(tmp_path):
    path = saved(Image.new("RGB", (8, 6), (10, 200, 30)), tmp_path / "a.jpg", quality=95)
    image = load_rgb(path)
    assert image.size == (8, 6)
    assert np.abs(pixels(image) - (10, 200, 30)).max() <= 3


def test_grayscale_l(tmp_path):
    path = saved(Image.new("L", (4, 4), 100), tmp_path / "gray.png")
    assert (pixels(load_rgb(path)) == 100).all()


def test_one_bit(tmp_path):
    bits = Image.new("1", (4, 2), 0)
    bits.putpixel((3, 1), 1)
    path = saved(bits, tmp_path / "bits.png")
    assert opened_mode(path) == "1"
    out = pixels(load_rgb(path))
    assert (out[0, 0] == 0).all()
    assert (out[1, 3] == 255).all()


def test_grayscale_with_alpha_la_composites_on_white(tmp_path):
    values = np.array([[[200, 255], [0, 0], [0, 128]]], dtype=np.uint8)  # opaque, clear, half
    path = saved(Image.fromarray(values, mode="LA"), tmp_path / "la.png")
    assert opened_mode(path) == "LA"
    out = pixels(load_rgb(path))
    assert (out[0, 0] == 200).all()
    assert (out[0, 1] == 255).all()
    assert (np.abs(out[0, 2] - 127) <= 1).all()


def test_rgba_transparent_pixel_becomes_white_not_black(tmp_path):
    values = np.array(
        [[[10, 20, 30, 255], [0, 0, 0, 0], [0, 0, 0, 128]]], dtype=np.uint8
    )  # opaque, fully transparent black, half-transparent black
    path = saved(Image.fromarray(values, mode="RGBA"), tmp_path / "rgba.png")
    out = pixels(load_rgb(path))
    assert tuple(out[0, 0]) == (10, 20, 30)
    assert tuple(out[0, 1]) == WHITE
    assert (np.abs(out[0, 2] - 127) <= 1).all()


def palette_image() -> Image.Image:
    """Index 0 red, index 1 blue; left column red, the rest blue."""
    image = Image.new("P", (4, 4), 1)
    image.putpalette([255, 0, 0, 0, 0, 255] + [0, 0, 0] * 254)
    for y in range(4):
        image.putpixel((0, y), 0)
    return image


def test_palette_without_transparency(tmp_path):
    path = saved(palette_image(), tmp_path / "p.png")
    assert opened_mode(path) == "P"
    out = pixels(load_rgb(path))
    assert tuple(out[0, 0]) == RED
    assert tuple(out[0, 3]) == (0, 0, 255)


@pytest.mark.parametrize("suffix", [".png", ".gif"])
def test_palette_with_transparency_goes_through_rgba(tmp_path, suffix):
    # Index 1 (blue) is the transparent colour: it must come out white, not blue.
    path = saved(palette_image(), tmp_path / f"p{suffix}", transparency=1)
    assert opened_mode(path) == "P"
    out = pixels(load_rgb(path))
    assert tuple(out[0, 0]) == RED
    assert tuple(out[0, 3]) == WHITE


def test_animated_gif_gives_first_frame(tmp_path):
    frames = [Image.new("RGB", (4, 4), RED), Image.new("RGB", (4, 4), (0, 0, 255))]
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:])
    assert tuple(pixels(load_rgb(path))[0, 0]) == RED


def test_cmyk_jpeg(tmp_path):
    cmyk = Image.new("CMYK", (8, 8), (0, 255, 255, 0))  # no cyan, full magenta + yellow: red
    path = saved(cmyk, tmp_path / "cmyk.jpg", quality=95)
    assert opened_mode(path) == "CMYK"
    out = pixels(load_rgb(path))
    assert (np.abs(out - RED) <= 3).all()


SIXTEEN_BIT = np.array([[0, 32768, 65535, 257 * 100]], dtype=np.uint16)
EIGHT_BIT = [0, 128, 255, 100]  # PIL's clipping convert would give 0, 255, 255, 255


def test_16bit_png_scaled_by_value_range_not_clipped(tmp_path):
    path = saved(Image.fromarray(SIXTEEN_BIT), tmp_path / "deep.png")
    assert opened_mode(path) in ("I;16", "I")  # which one depends on the Pillow version
    out = pixels(load_rgb(path))
    assert out[0, :, 0].tolist() == EIGHT_BIT
    assert (out == out[..., :1]).all()  # gray: R == G == B


def test_16bit_big_endian_tiff(tmp_path):
    big_endian = Image.frombytes("I;16B", (4, 1), SIXTEEN_BIT.astype(">u2").tobytes())
    path = saved(big_endian, tmp_path / "deep.tif")
    assert opened_mode(path) == "I;16B"
    assert pixels(load_rgb(path))[0, :, 0].tolist() == EIGHT_BIT


def test_32bit_int_mode_i_uses_16bit_range(tmp_path):
    path = saved(Image.fromarray(SIXTEEN_BIT.astype(np.int32), mode="I"), tmp_path / "int.tif")
    assert opened_mode(path) == "I"
    assert pixels(load_rgb(path))[0, :, 0].tolist() == EIGHT_BIT


def test_16bit_pgm(tmp_path):
    path = saved(Image.fromarray(SIXTEEN_BIT), tmp_path / "deep.pgm")
    assert pixels(load_rgb(path))[0, :, 0].tolist() == EIGHT_BIT


def test_float_mode_f_in_unit_range_is_scaled(tmp_path):
    values = np.array([[0.0, 0.5, 1.0]], dtype=np.float32)
    path = saved(Image.fromarray(values, mode="F"), tmp_path / "float.tif")
    assert opened_mode(path) == "F"
    assert pixels(load_rgb(path))[0, :, 0].tolist() == [0, 128, 255]


def test_float_mode_f_beyond_unit_range_follows_0_255(tmp_path):
    values = np.array([[-5.0, 100.0, 300.0]], dtype=np.float32)
    path = saved(Image.fromarray(values, mode="F"), tmp_path / "float.tif")
    assert pixels(load_rgb(path))[0, :, 0].tolist() == [0, 100, 255]


# ---------------------------------------------------------------------------------------------
# Orientation and decode size


def test_exif_orientation_is_applied(tmp_path):
    # Stored 40 wide x 20 high, left half red; orientation 6 = "rotate 90 degrees clockwise to
    # display", which puts the left half at the top.
    stored = Image.new("RGB", (40, 20), (0, 0, 255))
    stored.paste(RED, (0, 0, 20, 20))
    exif = Image.Exif()
    exif[0x0112] = 6
    path = saved(stored, tmp_path / "phone.jpg", exif=exif, quality=95)
    image = load_rgb(path)
    assert image.size == (20, 40)
    out = pixels(image)
    assert (np.abs(out[5, 10] - RED) <= 10).all()
    assert (np.abs(out[35, 10] - (0, 0, 255)) <= 10).all()


@pytest.fixture(scope="module")
def big_jpeg(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.jpg"
    Image.new("RGB", (2000, 2000), (50, 100, 150)).save(path)
    return path


def test_max_side_drafts_jpeg_smaller_at_decode_time(big_jpeg):
    image = load_rgb(big_jpeg, max_side=300)
    width, height = image.size
    assert 300 <= width < 2000 and 300 <= height < 2000
    assert image.size == (500, 500)  # largest power-of-2 reduction that stays >= 300


def test_max_side_never_goes_below_the_request(big_jpeg):
    assert load_rgb(big_jpeg, max_side=1001).size == (2000, 2000)  # halving would give 1000
    assert load_rgb(big_jpeg).size == (2000, 2000)


def test_max_side_is_only_a_hint_for_other_formats(tmp_path):
    path = saved(Image.new("RGB", (600, 400)), tmp_path / "a.png")
    assert load_rgb(path, max_side=100).size == (600, 400)


def test_max_side_must_be_positive(big_jpeg):
    with pytest.raises(ValueError):
        load_rgb(big_jpeg, max_side=0)


# ---------------------------------------------------------------------------------------------
# Bad inputs


def noise_jpeg(path: Path) -> Path:
    """A JPEG whose data is spread over the whole file, so cutting it loses pixels."""
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    return saved(Image.fromarray(noise), path)


def test_truncated_jpeg(tmp_path):
    path = noise_jpeg(tmp_path / "cut.jpg")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    error = expect_read_error(path, "truncated or corrupt")
    assert isinstance(error, UserError)  # so the CLI prints it without a traceback


def test_truncated_png(tmp_path):
    path = saved(Image.fromarray(np.arange(4096, dtype=np.uint16).reshape(64, 64) % 251 > 100),
                 tmp_path / "cut.png")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    expect_read_error(path, "truncated or corrupt")


def test_text_file_named_jpg(tmp_path):
    path = tmp_path / "notes.jpg"
    path.write_text("these are not pixels\n")
    expect_read_error(path, "not an image")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.png"
    path.write_bytes(b"")
    expect_read_error(path, "empty file (0 bytes)")  # not "not an image": the download or copy failed


def test_broken_link(tmp_path):
    path = tmp_path / "gone.jpg"
    path.symlink_to(tmp_path / "moved-away.jpg")
    expect_read_error(path, f"broken link to {tmp_path / 'moved-away.jpg'}")


def test_missing_file(tmp_path):
    expect_read_error(tmp_path / "nowhere.jpg", "no such file")


def test_directory(tmp_path):
    expect_read_error(tmp_path, "is a directory")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="root (or a non-POSIX system) can read files without read permission")
def test_permission_denied(tmp_path):
    path = noise_jpeg(tmp_path / "locked.jpg")
    path.chmod(0)
    try:
        expect_read_error(path, "permission denied")
    finally:
        path.chmod(0o644)


def test_permission_denied_message_even_as_root(tmp_path, monkeypatch):
    # Root ignores file modes, so simulate what open() raises for an unreadable file.
    import inceptionlab.data.io.decode as images

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(images, "open", refuse, raising=False)
    expect_read_error(noise_jpeg(tmp_path / "locked.jpg"), "permission denied", "readable")


def test_image_above_the_bomb_limit_is_an_error(tmp_path, monkeypatch):
    path = saved(Image.new("RGB", (100, 100)), tmp_path / "huge.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # error above 2 x 1000 pixels
    expect_read_error(path, "image too large: 100 x 100 pixels", "downscale it first")


def test_image_in_the_bomb_warning_band_loads(tmp_path, monkeypatch):
    path = saved(Image.new("RGB", (100, 100)), tmp_path / "large.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 6000)  # 10 000 pixels: PIL warns, does not fail
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_rgb(path).size == (100, 100)
    # The decoder leaves PIL's warning to the application (a library touches no warning filter) ...
    assert [w.category for w in caught] == [Image.DecompressionBombWarning]


def test_the_cli_silences_pils_per_file_warnings_for_its_process(tmp_path, monkeypatch, cli, recwarn):
    path = saved(Image.new("RGB", (100, 100)), tmp_path / "large.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 6000)
    assert cli("recipes").code == 0  # any command: the CLI sets its filters once, as it starts
    assert load_rgb(path).size == (100, 100)
    assert not [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)]


def test_decoding_in_threads_leaves_the_warning_filters_as_they_were(tmp_path):
    """The server decodes uploads in a thread pool. `warnings.catch_warnings()` per decode, as the
    decoder once did, swaps the process-wide filter list: two threads interleaving left one thread's
    temporary filters installed for good. Threads switch every microsecond here to interleave them."""
    data = saved(Image.new("RGB", (8, 8)), tmp_path / "small.png").read_bytes()
    before = list(warnings.filters)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=lambda: [decode_rgb(data) for _ in range(300)]) for _ in range(8)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(interval)
    assert warnings.filters == before


# ---------------------------------------------------------------------------------------------
# expand_image_paths


def touch_image(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return saved(Image.new("RGB", (2, 2)), path, format="PNG")


def test_expand_mixes_files_directories_and_errors(tmp_path):
    single = touch_image(tmp_path / "single.webp.bin")  # explicit file: kept whatever its name
    photos = tmp_path / "photos"
    expected_in_photos = [
        touch_image(photos / "A.JPG"),
        touch_image(photos / "b.png"),
        touch_image(photos / "nested" / "deeper" / "c.jpeg"),
        touch_image(photos / "nested" / "d.TIFF"),
        touch_image(photos / "z.gif"),
    ]
    (photos / "readme.txt").write_text("not an image")
    touch_image(photos / ".hidden.jpg")  # e.g. macOS ._photo.jpg resource forks
    touch_image(photos / ".ipynb_checkpoints" / "x.jpg")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no images here")
    missing = tmp_path / "missing.jpg"

    files, errors = expand_image_paths([single, str(photos), empty, missing])

    assert files == [single, *sorted(expected_in_photos)]
    assert errors[0][0] == str(empty)
    assert errors[0][1].startswith("directory has no images (looked for .jpg, ")
    assert errors[1] == (str(missing), "no such file or directory")
    assert len(errors) == 2
    assert all("\n" not in message for _, message in errors)


def test_expand_order_is_deterministic_and_sorted(tmp_path):
    for name in ["c.jpg", "a.jpg", "b/x.png", "b.jpg"]:
        touch_image(tmp_path / name)
    files, errors = expand_image_paths([tmp_path])
    assert errors == []
    assert files == sorted(files)
    # Paths sort component by component, so a folder's files stay together.
    assert [p.relative_to(tmp_path).as_posix() for p in files] == [
        "a.jpg", "b/x.png", "b.jpg", "c.jpg"
    ]
    assert expand_image_paths([tmp_path]) == (files, [])


def test_expand_not_recursive(tmp_path):
    top = touch_image(tmp_path / "top.jpg")
    touch_image(tmp_path / "sub" / "below.jpg")
    assert expand_image_paths([tmp_path], recursive=False) == ([top], [])


def test_expand_survives_symlink_loops(tmp_path):
    image = touch_image(tmp_path / "d" / "a.jpg")
    (tmp_path / "d" / "loop").symlink_to(tmp_path / "d", target_is_directory=True)
    files, errors = expand_image_paths([tmp_path / "d"])
    assert files == [image] and errors == []


def test_every_extension_is_lowercase_with_a_dot():
    assert set(IMAGE_EXTENSIONS) >= {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif",
                                     ".tiff", ".ppm", ".pgm"}
    assert all(ext.startswith(".") and ext == ext.lower() for ext in IMAGE_EXTENSIONS)


def test_expanded_files_all_load(tmp_path):
    touch_image(tmp_path / "one.png")
    touch_image(tmp_path / "two" / "TWO.JPEG")
    files, _ = expand_image_paths([tmp_path])
    assert [load_rgb(p).size for p in files] == [(2, 2), (2, 2)]


# ---------------------------------------------------------------------------------------------
# Real photos


def test_real_photos_load_as_rgb():
    folder = shared_data("imagenet-sample") / "images"
    files, errors = expand_image_paths([folder])
    assert errors == [] and files
    for path in files:
        image = load_rgb(path)
        assert image.mode == "RGB" and min(image.size) > 0
        small = load_rgb(path, max_side=128)
        assert small.mode == "RGB"
        assert min(small.size) >= min(128, *image.size)
        assert small.width <= image.width and small.height <= image.height


# ---------------------------------------------------------------------------------------------
# Phone and web formats: HEIC (iPhones' default), AVIF, .jfif (a JPEG as browsers save it)

# An ISO-BMFF header as an iPhone's HEIC starts: a box `ftyp` of major brand `heic`. PIL does not
# identify it without the pillow-heif plugin.
HEIC_HEADER = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(64)


@pytest.mark.parametrize("name", ["IMG_0001.HEIC", "IMG_0002.heic", "edit.heif", "web.avif", "W.AVIF", "saved.jfif"])
def test_phone_and_web_photo_formats_count_as_images(name):
    """A folder of iPhone photos (HEIC) or browser downloads (AVIF, .jfif) must not be skipped as
    "not images": they are the user's photos, read or refused with a reason, never silently left out."""
    assert counts_as_image(name)


def test_an_avif_photo_loads(tmp_path):
    from PIL import features

    if not features.check("avif"):
        pytest.skip(f"this Pillow ({Image.__version__}) was built without AVIF (Pillow >= 11.3 wheels have it)")
    image = Image.new("RGB", (40, 30), RED)
    loaded = load_rgb(saved(image, tmp_path / "web.avif", quality=95))
    assert loaded.size == (40, 30) and np.abs(pixels(loaded) - RED).max() <= 8


def test_a_heic_photo_loads_with_pillow_heif(tmp_path):
    pillow_heif = pytest.importorskip("pillow_heif", reason="pillow-heif (the `heif` extra) is not installed")
    path = tmp_path / "IMG_0001.HEIC"
    pillow_heif.from_pillow(Image.new("RGB", (48, 32), RED)).save(path, quality=95)
    loaded = load_rgb(path)
    assert loaded.size == (48, 32) and np.abs(pixels(loaded) - RED).max() <= 8
    served = decode_rgb(path.read_bytes(), "upload")  # the server's uploads have no file name to go by
    assert served.size == (48, 32)


def test_a_heic_photo_without_the_plugin_names_the_fix(tmp_path):
    """Without pillow-heif (blocked in a fresh interpreter: registering a PIL plugin is for the whole
    process), a HEIC photo is refused with the one line that says how to read it."""
    import subprocess

    path = tmp_path / "IMG_0001.HEIC"
    path.write_bytes(HEIC_HEADER)
    script = ("import sys; sys.modules['pillow_heif'] = None\n"
              "from inceptionlab.data.io.decode import ImageReadError, load_rgb\n"
              "try:\n    load_rgb(sys.argv[1])\nexcept ImageReadError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    message = done.stdout.strip()
    assert str(path) in message and "HEIC" in message and "pip install 'inceptionlab[heif]'" in message
    assert "\n" not in message
