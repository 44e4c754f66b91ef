"""Media in the prompt: content parts -> the model's processor (placeholders, pixels, audio features) in
preprocessing, and its towers and projector (media -> embedding rows) in the multimodal_encoders model."""
