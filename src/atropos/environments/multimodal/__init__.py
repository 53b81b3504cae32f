"""Multimodal environments: a question about a picture, the picture in the group's `images`.

Four registered environments, upstream's "multimodal DPO" family (atroposlib 0.4.0's
`environments/multimodal_dpo/`, which despite the name are +-1 exact-match GRPO environments):

- `ocr_vqa` (`ocr_vqa.OCRVQA`): read a generated book cover (`book_cover`), or OCR-VQA's;
- `clevr` (`clevr.Clevr`): counting and compositional questions about CLEVR-style scenes
  (`clevr_scene`), or the hub's CLEVR sets, answered in `\\boxed{}`;
- `clock_reading` (`clock_reading.ClockReading`): tell the time from an analogue clock face,
  within a tolerance, or from the hub's clock dataset;
- `pixmo_count` (`pixmo_count.PixmoCount`): count, or point at, icons of one kind among others
  in PixMo-Count's format, or PixMo-Count's own web pictures.

They share almost everything, so they live in one package: `base.VisionEnv` (items from seeds
or a hub dataset, the prompt with its image, scores, metrics; sampling through chat completions
with the text-only copy retokenized for the trainer is `common.vision.ImageEnv`'s, shared with
`visual_counting`), `answers` (reading `<answer>` or `\\boxed{}`, normalised comparison,
times), `images` (checked downloads), `drawing` (colours, icons, shaded solids, placing objects
apart) and `demo` (the offline demo responder). Pillow is the `vision` extra, imported when
a picture is first drawn; importing this package imports none of the members.
docs/multimodal.md.
"""
