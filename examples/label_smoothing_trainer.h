// A Trainer whose training loss is label-smoothed cross-entropy (Hugging Face's
// label_smoothing_factor, Szegedy et al. 2016): each target's loss is
// (1 - eps) * nll(target) + eps * mean over classes of -log p(class). Only ComputeLoss changes;
// evaluation calls it too, so eval_loss is the smoothed loss, as in Hugging Face. (Setting
// args.label_smoothing_factor does the same without a subclass; this shows the override.)
//
//   LabelSmoothingTrainer trainer(/*epsilon=*/0.1, args, model, train_data, eval_data);
//   CT_ASSIGN_OR_RETURN(cpptrain::TrainOutput out, trainer.Train());
#ifndef CPPTRAIN_EXAMPLES_LABEL_SMOOTHING_TRAINER_H_
#define CPPTRAIN_EXAMPLES_LABEL_SMOOTHING_TRAINER_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "module/batch.h"
#include "module/trainable_model.h"
#include "proto/training_args.pb.h"
#include "trainer/data/dataset.h"
#include "trainer/trainer.h"

namespace example {

class LabelSmoothingTrainer : public cpptrain::Trainer {
 public:
  LabelSmoothingTrainer(double epsilon, cpptrain::proto::TrainingArguments args,
                        std::shared_ptr<cpptrain::TrainableModel> model,
                        std::shared_ptr<const cpptrain::Dataset> train_dataset,
                        std::shared_ptr<const cpptrain::Dataset> eval_dataset)
      : Trainer(std::move(args), std::move(model), std::move(train_dataset),
                std::move(eval_dataset)),
        epsilon_(epsilon) {}

 protected:
  // The smoothed loss summed over this micro-batch's counted labels, divided (as the base
  // class does) by the number of targets in the whole optimizer step, so gradient
  // accumulation and several ranks still give the gradient of one big batch.
  torch::Tensor ComputeLoss(cpptrain::TrainableModel& model, const cpptrain::Batch& batch,
                            int64_t num_items_in_batch) override;

 private:
  double epsilon_;
};

}  // namespace example

#endif  // CPPTRAIN_EXAMPLES_LABEL_SMOOTHING_TRAINER_H_
