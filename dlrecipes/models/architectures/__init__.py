"""The torch modules behind the built-in model factories (imports torch).

Modules:
- :mod:`.airbench`: the airbench CIFAR-10 speedruns' network (airbench94 and airbench96)
- :mod:`.cifar_resnet`: ResNet-18 and pre-activation ResNet-18 for 32x32 images
- :mod:`.fusion_cnn`: a small late-fusion CNN: an encoder per input, a head per output
- :mod:`.simple_cnn`: small CNNs for MNIST-sized images
"""
