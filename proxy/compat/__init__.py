"""llama-swap compatibility: its API pages, profiles and selectors, ComfyUI, its log options."""
