"""The model's weights: built layer by layer from the checkpoint (or random, for a rehearsal), quantized
to NF4, cached, shared between ranks, partitioned by ZeRO-3 and placed on the devices."""
