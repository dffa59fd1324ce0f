// placeholder: being written (see format/nvfp4.h)
