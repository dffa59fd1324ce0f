// placeholder: being written (see format/safetensors.h)
