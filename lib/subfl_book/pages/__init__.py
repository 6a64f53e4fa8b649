"""Page-specific helpers of the book: one module per chapter, called from its notebooks."""
