"""GEM creative writing (Table 2): poem and story diversity (16 samples per prompt; sampling set on the model)."""

from mmengine.config import read_base

with read_base():
    from .distmatch_poem_diversity_gen import distmatch_poem_diversity_datasets as _poem
    from .distmatch_story_diversity_gen import distmatch_story_diversity_datasets as _story

distmatch_creative_datasets = [*_poem, *_story]
